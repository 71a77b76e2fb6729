"""Running a declared pipeline: opening its state, one Spark streaming query per output
(each batch committed by spark_app.runtime.commit), supervising them, reporting, stopping.

A query whose failure may be transient (a storage outage) is restarted from its last
commit, for the outage budget; any other failure ends the driver with an exit code of
spark_app.contract, which the operator reads. SIGTERM lets the batch in flight finish,
then stops; a batch that cannot finish in time is abandoned and replayed by the next
driver. A driver superseded by a higher epoch stops without committing (Fenced).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_app import contract
from spark_app.persistence import Backend, Config
from spark_app.runtime import scratch, startup
from spark_app.runtime.commit import (
    BatchHandler,
    StateDamaged,
    check_checkpoints,
    clear_unplanned,
    offsets_by_source,
    planned_first_batches,
    settled_queries,
)
from spark_app.runtime.jvm import first_batch, metadata_warm_up, state_stores
from spark_app.runtime.jvm.conf import spark_conf
from spark_app.runtime.jvm.launch import AHEAD_OF_THE_USERS
from spark_app.runtime.kafka_clients import parse_offsets
from spark_app.runtime.pipeline import Pipeline, PipelineError
from spark_app.runtime.plan import KeyNotInOutput
from spark_app.runtime.reporting import PodReporter
from spark_app.runtime.sinks.base import OutputDamaged
from spark_app.runtime.sources.backfill import TableRewound
from spark_app.runtime.sources.delta_table import (
    BackfillError,
    DeltaTableView,
    LiveRate,
    Planner,
    PlanStore,
)
from spark_app.runtime.sources.kafka import (
    DEAD_LETTER_PROPERTY,
    KafkaDataLost,
    KafkaTopicMissing,
    KafkaTracker,
    data_lost_in_spark,
)
from spark_app.runtime.sources.kafka import lag as kafka_lag
from spark_app.runtime.sources.reader import SourceOrderChanged
from spark_app.runtime.stop_requests import StopRequests
from spark_app.runtime.tables.readers import PlanMissing, Readers, TableMissing
from spark_app.state.file_index import IndexCorrupted
from spark_app.state.identity import IncompatibleChange
from spark_app.state.log import LogCorrupted
from spark_app.state.records import QueryHead
from spark_app.state.session import (
    LEASE_KEY,
    AlreadyRunning,
    Fenced,
    Holder,
    LeaseDamaged,
    StaleEpoch,
    StateOwnedElsewhere,
    StateSession,
)
from spark_app.state.tables import BACKFILL, HoldBroken, TableError
from spark_app.storage import RetryPolicy, Storage, StorageMisconfigured, StorageUnavailable, join

log = logging.getLogger("spark_app")

_EXIT_CODES: list[tuple[type[BaseException], int]] = [
    (Fenced, contract.EXIT_FENCED),
    (StaleEpoch, contract.EXIT_FENCED),
    (AlreadyRunning, contract.EXIT_ALREADY_RUNNING),
    (IncompatibleChange, contract.EXIT_MISCONFIGURED),
    (StorageMisconfigured, contract.EXIT_MISCONFIGURED),
    (PipelineError, contract.EXIT_MISCONFIGURED),
    (KeyNotInOutput, contract.EXIT_MISCONFIGURED),
    (SourceOrderChanged, contract.EXIT_MISCONFIGURED),
    (OutputDamaged, contract.EXIT_MISCONFIGURED),
    (StateOwnedElsewhere, contract.EXIT_MISCONFIGURED),
    (LogCorrupted, contract.EXIT_MISCONFIGURED),
    (LeaseDamaged, contract.EXIT_MISCONFIGURED),
    (IndexCorrupted, contract.EXIT_MISCONFIGURED),
    (StateDamaged, contract.EXIT_MISCONFIGURED),
    (KafkaDataLost, contract.EXIT_MISCONFIGURED),
    (KafkaTopicMissing, contract.EXIT_MISCONFIGURED),
    (BackfillError, contract.EXIT_MISCONFIGURED),
    (TableRewound, contract.EXIT_MISCONFIGURED),
    (StorageUnavailable, contract.EXIT_STORAGE_UNAVAILABLE),
    (HoldBroken, contract.EXIT_TABLE_VERSIONS_GONE),
    (TableMissing, contract.EXIT_MISCONFIGURED),
    (PlanMissing, contract.EXIT_MISCONFIGURED),
    (TableError, contract.EXIT_MISCONFIGURED),
]


LEASE_RENEWALS_PER_TTL = 6
"""Renewals within one lease lifetime: five can fail (a storage hiccup, a slow write)
before a live driver's lease lapses."""

SNAPSHOT_AT_STOP_S = 10.0
"""How long a clean stop waits for its keyed outputs' last snapshot (within the pod's
default grace of 30 s: up to 20 s for the batch in flight, then this)."""


@dataclass(frozen=True)
class RunOptions:
    trigger_interval_ms: int = 1000
    """How often each query looks for new input."""
    stop_when_idle: bool = False
    """Stop once every source's available input is processed and committed (a batch run)."""
    stop_timeout_s: float = 20.0
    """On SIGTERM, how long the batch in flight may take to finish before it is abandoned."""


def exit_code_for(error: BaseException) -> int:
    for kind, code in _EXIT_CODES:
        if isinstance(error, kind):
            return code
    return contract.EXIT_FAILED


class Driver:
    def __init__(self, pipeline: Pipeline, config: Config, options: RunOptions) -> None:
        self._pipeline = pipeline
        self._config = config
        self._options = options
        self._queries: dict[str, StreamingQuery] = {}
        self._handlers: dict[str, BatchHandler] = {}
        self._stops = StopRequests()
        self._fatal: BaseException | None = None
        self._commit_lock = threading.Lock()
        self._session: StateSession | None = None
        self._reporter: PodReporter | None = None
        self._readers: Readers | None = None
        self._snapshots: Storage | None = None
        self._planners: list[Planner] = []
        self._plan_stores: dict[str, PlanStore] = {}
        self._state = "starting"
        self._started_at = startup.process_started()
        self._moments: dict[str, float] = {}
        """When each phase of the start ended (wall clock): declared, state."""
        self._recoveries: dict[str, tuple[float, float]] = {}
        self._started_up: set[str] = set()
        """The queries whose start-up line is logged."""

    # ---- lifecycle -------------------------------------------------------------------

    def run(self) -> int:
        """Runs until stopped; returns the process exit code (see spark_app.contract)."""
        if not self._pipeline.queries:
            raise PipelineError("the pipeline has no outputs: declare one with spark_app.io.<format>.write(...)")
        self._moments["declared"] = time.time()
        # Now that this driver's own scratch folders are held, and its log is set up.
        scratch.sweep_once(tempfile.gettempdir())
        previous = self._install_signal_handlers()
        try:
            self._start()
            self._supervise()
            return self._finish()
        except BaseException as error:  # noqa: BLE001 - every failure becomes one exit code and message
            return self._fail(error)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def request_stop(self, reason: str) -> None:
        self._stops.request(reason)

    def _start(self) -> None:
        config = self._config
        # Each operation rides out an outage for the budget, then the driver exits with
        # EXIT_STORAGE_UNAVAILABLE and the operator relaunches it once storage is back.
        retry = RetryPolicy(deadline_s=config.outage_budget_s)
        metadata = config.metadata_storage.storage(retry)
        snapshots = config.snapshot_storage.storage(retry)
        # StateSession.open probes the metadata's root; on S3 each probe is three requests,
        # each a round trip of the start, so a root shared with it (the operator's) is not
        # probed twice.
        if config.snapshot_storage != config.metadata_storage:
            snapshots.check_writable()
        self._snapshots = snapshots
        spark = self._pipeline.spark()
        environment = self._pipeline.environment
        # What the user asked of Spark outlasts the backend's defaults: a local run's
        # SPARK_APP_SPARK_CONF as the pipeline's own settings (under the operator both are the
        # pipeline's sparkConf). The session started with the former, so only the latter can
        # have come too late to be warned about.
        requested = {**environment.spark_conf, **config.spark_conf}
        apply_runtime_conf(spark, spark_conf(config.snapshot_storage, config.snapshot_interval_ms, requested),
                           requested=config.spark_conf)
        holder = Holder.this_process(config.pipeline or os.path.basename(environment.pipeline_file))
        self._reporter = PodReporter.for_pod(environment.pod_name, environment.pod_namespace)
        self._session = StateSession.open(metadata, self._pipeline.manifest(), holder=holder,
                                          requested_epoch=config.epoch, owner=config.pipeline,
                                          log_retained=config.log_retained,
                                          lease_ttl_ms=int(config.lease_ttl_s * 1000))
        # Beside the rest of the start, before the resumed queries read their checkpoints.
        metadata_warm_up.start(spark, (bool(spec.facts.stateful) for name, spec in self._pipeline.queries.items()
                                       if spec.df is not None and name in self._session.heads))
        self.report()
        # Renewed from now on, not once the pipeline runs: a start (a busy node's JVM, a
        # large first batch) may outlast the lease, and the next driver would take over.
        threading.Thread(target=self._renew_lease_forever, name="spark_app-lease", daemon=True).start()
        if self._pipeline.shared:
            # Set once its holds are registered: the renewal thread refreshes lookups' holds.
            plans = {pid: self._plan_store(snapshots, pid).version for pid, table in self._pipeline.shared.items()
                     if table.kind == BACKFILL}
            readers = Readers(self._pipeline.shared, config.pipeline, self._session.state_id,
                              self._reset_hint(metadata.root_uri), plans)
            readers.open(self._session.heads,
                         planned_first_batches(snapshots, self._pipeline.queries, self._session.heads),
                         {name: spec.tables for name, spec in self._pipeline.queries.items()},
                         settled_queries(snapshots, self._session.heads))
            self._readers = readers
        streaming = {n for n, q in self._pipeline.queries.items() if q.df is not None}
        check_checkpoints(snapshots, {n: h for n, h in self._session.heads.items() if n in streaming})
        clear_unplanned(snapshots, sorted(streaming - self._session.heads.keys()))
        # Dead letters on S3 are reached as the state is, or, with state on a volume, as the sources are.
        s3 = config.snapshot_storage.s3_options if config.snapshot_storage.kind == "s3" else environment.s3
        beside_output = config.dead_letter_uri or self._pipeline.default_dead_letter()
        # A pipeline whose outputs are all Kafka topics or shared tables keeps its dead letters
        # with its state.
        dead_letter = (Backend.from_uri(beside_output, options=s3) if beside_output else
                       dataclasses.replace(config.snapshot_storage,
                                           root=config.snapshot_storage.root.rstrip("/") + "/dead-letters"))
        self._pipeline.write_context(config.snapshot_storage, dead_letter,
                                     {**config.source_limits, "index_compact_after": config.index_compact_after},
                                     config.outage_budget_s)
        # Inherited by the queries started from this thread, and sent with their tasks: where
        # Kafka sources' tasks set messages aside (the queries' plans were fixed before now).
        spark.sparkContext.setLocalProperty(DEAD_LETTER_PROPERTY, json.dumps(dead_letter.to_json()))
        trackers = self._pipeline.trackers(snapshots, dead_letter, config.index_compact_after)
        for tracker in trackers.values():
            if isinstance(tracker, KafkaTracker):
                tracker.check_topics()  # Spark's source would wait for a missing topic without a word
        self._start_planners(snapshots, retry)
        self._moments["state"] = time.time()
        for name, spec in self._pipeline.queries.items():
            handler = BatchHandler(name, spec, self, snapshots, trackers)
            self._handlers[name] = handler
            self._start_query(name)
        self._state = "running"
        log.info("pipeline running at epoch %d: %s", self._session.epoch, ", ".join(
            f"{o.name} -> {o.path}" for q in self._pipeline.queries.values() for o in q.sink.outputs()))

    def _start_planners(self, snapshots: Storage, retry: RetryPolicy) -> None:
        """One planner per table source: it writes the plans the source's queries read."""
        spark = self._pipeline.spark()
        live = LiveSettingsFile(self._pipeline.environment.live_settings_file)
        for pid, source in self._pipeline.tables.items():
            planner = Planner(pid, DeltaTableView(spark, source.table, source.schema, retry),
                              self._plan_store(snapshots, pid),
                              source.settings, committed=functools.partial(self._plans_committed, pid),
                              poll_s=self._options.trigger_interval_ms / 1000,
                              live_rate=functools.partial(live.backfill_rate, pid))
            planner.start(on_error=self._planner_failed)
            self._planners.append(planner)

    def _plan_store(self, snapshots: Storage, pid: str) -> PlanStore:
        """One per table source: its planner writes the plans, a shared table's hold asks
        which version each reached (spark_app.runtime.tables.readers)."""
        if pid not in self._plan_stores:
            self._plan_stores[pid] = PlanStore(snapshots, pid)
        return self._plan_stores[pid]

    def _plans_committed(self, pid: str) -> int:
        heads = self.session.heads
        return min((int(heads[name].offsets.get(pid, {}).get("plans", 0)) if name in heads else 0
                    for name, spec in self._pipeline.queries.items() if pid in spec.sources), default=0)

    def _planner_failed(self, error: BaseException) -> None:
        self._fatal = self._fatal or error

    def _stop_planners(self) -> None:
        for planner in self._planners:
            planner.stop()

    def _start_query(self, name: str) -> None:
        spec = self._pipeline.queries[name]
        handler = self._handlers[name]
        began = time.time()
        handler.recover()
        self._recoveries.setdefault(name, (began, time.time()))
        if spec.df is None:
            return  # nothing streams into it: recover() did its one run
        # A query restarted after a failure runs in a JVM that has warmed up: with code generation.
        with first_batch.started_without_codegen(spec.df.sparkSession, when=name not in self._queries) as deferred:
            handler.codegen_after_first_batch = deferred  # before the start: the batch may be quick
            query = (
                spec.df.writeStream.queryName(name)
                .outputMode(spec.facts.output_mode)
                .option("checkpointLocation", handler.checkpoint_uri)
                .trigger(processingTime=f"{self._options.trigger_interval_ms} milliseconds")
                .foreachBatch(handler)
                .start()
            )
        self._queries[name] = query

    def _supervise(self) -> None:
        idle_since: float | None = None
        restarts: dict[str, _Restarts] = {name: _Restarts() for name in self._queries}
        while not self._stops.requested.is_set():
            if self._fatal is not None:
                raise self._fatal
            self._log_startups()
            for name, query in list(self._queries.items()):
                if not query.isActive:
                    self._restart_or_raise(name, query, restarts[name])
                    continue
                if self._handlers[name].committed_since(restarts[name].since):
                    restarts[name] = _Restarts()
                self._handlers[name].between_batches()
            if self._options.stop_when_idle:
                if self._idle():
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since >= 2 * self._options.trigger_interval_ms / 1000:
                        self.request_stop("all available input is processed")
                else:
                    idle_since = None
            self._stops.wait(0.2)

    def _log_startups(self) -> None:
        """Says where each query's start went, once its first batch is done."""
        for name, query in self._queries.items():
            if name in self._started_up:
                continue
            try:
                progress = last_progress(query)
            except Exception:  # noqa: BLE001 - the query may be restarting; its line can wait
                continue
            if progress:
                self._started_up.add(name)
                log.info("%s", startup.from_progress(name, self._started_at, self._moments["declared"],
                                                     self._moments["state"], self._recoveries[name],
                                                     progress).describe())

    def _restart_or_raise(self, name: str, query: StreamingQuery, restarts: _Restarts) -> None:
        if self._fatal is not None:
            raise self._fatal
        error = query.exception()
        if error is None:
            raise RuntimeError(f"query {name} stopped by itself")
        message = _first_line(str(error))
        kafka_sources = [pid for pid in self._pipeline.queries[name].sources if pid in self._pipeline.kafka]
        lost = data_lost_in_spark(kafka_sources, str(error)) if kafka_sources else None
        if lost is not None:
            raise lost
        if not _looks_transient(str(error)):
            raise QueryFailed(f"query {name} failed: {message}")
        if restarts.started is None:
            restarts.started = time.monotonic()
        elapsed = time.monotonic() - restarts.started
        if elapsed > self._config.outage_budget_s:
            raise StorageUnavailable(f"query {name} kept failing for {elapsed:.0f}s (the outage budget is "
                                     f"{self._config.outage_budget_s:.0f}s); last error: {message}")
        delay = min(30.0, 0.5 * 2 ** restarts.count)
        restarts.count += 1
        log.warning("query %s failed (%s); restarting it from its last commit in %.1fs (attempt %d)",
                    name, message, delay, restarts.count)
        if self._stops.wait(delay):
            return
        restarts.since = time.monotonic()
        self._start_query(name)

    def _idle(self) -> bool:
        for name, query in self._queries.items():
            status = query.status
            if status["isTriggerActive"] or status["isDataAvailable"] or query.lastProgress is None:
                return False
            if not self._handlers[name].caught_up():
                return False
        return True

    def _finish(self) -> int:
        log.info("stopping: %s", self._stops.reason)
        self._state = "stopping"
        self._stop_planners()
        unreachable = self._unreachable_storage()
        # In an outage the batch in flight cannot commit: it is abandoned at once.
        self._stop_queries(0.0 if unreachable else self._options.stop_timeout_s)
        if self._fatal is not None:
            raise self._fatal
        if unreachable is not None:
            # Nothing more can be committed, and the stop's writes (the outputs' and the state
            # stores' snapshots, the stop record, the lease's release) would each retry for
            # the outage budget, Spark's stores through S3A's retries as well: a SIGTERM in
            # an outage took 120 s, past any pod's grace period. The next driver resumes from
            # the last commit.
            raise StorageUnavailable(f"stopping ({self._stops.reason}) while the state's storage is unreachable "
                                     f"({unreachable}): nothing more was committed; the next driver resumes "
                                     f"from the last commit")
        if self._readers is not None and self._snapshots is not None:
            # The queries' batches are done: no replay reads where their last ones started.
            for name in settled_queries(self._snapshots, self.session.heads):
                self._readers.settled(name)
        for name, handler in self._handlers.items():
            try:
                handler.snapshot_before_stop(SNAPSHOT_AT_STOP_S)
            except StorageUnavailable as error:  # the changelog covers it; the stop goes on
                log.warning("query %s: no snapshot before stopping: %s", name, error)
        began = time.monotonic()
        stores = state_stores.store_snapshots(self._pipeline.spark())
        if stores:
            log.info("stored the snapshots of %d state stores in %.1fs", stores, time.monotonic() - began)
        assert self._session is not None
        self._session.close(self._stops.reason)
        self._close_outputs()
        self.report()
        if self._reporter is not None:
            self._reporter.close()
        log.info("stopped cleanly at %s", _describe_heads(self._session.heads))
        return contract.EXIT_OK

    def _unreachable_storage(self) -> StorageUnavailable | None:
        """The error of the state's storage if it does not answer, asked once without
        retries (None if it answers)."""
        once = RetryPolicy(deadline_s=0.0)
        for backend in {self._config.metadata_storage, self._config.snapshot_storage}:
            try:
                backend.storage(once).list(LEASE_KEY)
            except StorageUnavailable as error:
                return error
        return None

    def _stop_queries(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for name, query in self._queries.items():
            while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
                time.sleep(0.05)
            if query.isActive and query.status["isTriggerActive"]:
                log.warning("query %s: abandoning the batch in flight; the next driver replays it", name)
            query.stop()

    def _fail(self, error: BaseException) -> int:
        error = self._superseded(error) or error
        code = exit_code_for(error)
        message = str(error) if code != contract.EXIT_FAILED else f"{type(error).__name__}: {_first_line(str(error))}"
        if code == contract.EXIT_FAILED:
            log.exception("pipeline failed")
        else:
            log.error("%s", error)
        self._stop_planners()
        for query in self._queries.values():
            try:
                query.stop()
            except Exception:  # noqa: BLE001 - already failing; report the first error
                pass
        self._close_outputs()
        if self._reporter is not None:
            self._reporter.close(timeout=2.0)
        contract.write_termination_message(message, self._pipeline.environment.termination_log)
        return code

    def _superseded(self, error: BaseException) -> Fenced | None:
        """The fencing behind a failure, if a newer driver has taken over: a stale driver
        trips over the newer one's files (Spark's rename of a query's metadata file into a
        place the newer driver filled raises FileAlreadyExistsException), and such a failure
        is its fencing, not the pipeline's fault."""
        if self._session is None or exit_code_for(error) in (contract.EXIT_FENCED, contract.EXIT_STORAGE_UNAVAILABLE):
            return None  # an outage would only hold this check up for the outage budget again
        try:
            self._session.check_not_fenced()
        except Fenced as fenced:
            return Fenced(f"{fenced} (what it tripped over: {type(error).__name__}: {_first_line(str(error))})")
        except Exception:  # noqa: BLE001 - the check is a refinement; the first error stands
            pass
        return None

    def _close_outputs(self) -> None:
        for spec in self._pipeline.queries.values():
            spec.sink.close()

    def _install_signal_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, self._stops.on_signal)
        return previous

    def _renew_lease_forever(self) -> None:
        assert self._session is not None
        warned = False
        while not self._stops.requested.wait(self._config.lease_ttl_s / LEASE_RENEWALS_PER_TTL):
            try:
                status: contract.DriverReport | None = self._status()
            except Exception as error:  # noqa: BLE001 - a report must never stop the renewal
                # Without this the thread ended, the live driver's lease lapsed, and the next
                # driver took over (seen in make demo: a Kafka lag read failed).
                if not warned:
                    log.warning("could not build the driver's report; renewing the lease without it: %s", error)
                    warned = True
                status = None
            try:
                self._session.renew_lease(status=json.loads(status.to_json()) if status else None)
                if status is not None:
                    self.report(status)
            except Fenced as error:
                self._fatal = error
                return
            except StorageUnavailable as error:
                log.warning("could not renew the lease: %s", error)
            self._refresh_lookups()

    def _refresh_lookups(self) -> None:
        """Moves idle lookups' holds to the latest version; one that fails is moved at the
        next renewal. Like a report, it must never end the lease thread (a query being
        restarted fails its status call; a table's log may be unreachable)."""
        if self._readers is None:
            return
        try:
            self._readers.refresh_lookups(self._looking_up)
        except Exception as error:  # noqa: BLE001 - the lease outranks a lookup's hold
            log.warning("could not move the lookups' holds on their tables: %s", error)

    def _looking_up(self) -> bool:
        """Whether a query that looks a table up has a batch under way."""
        for name, spec in self._pipeline.queries.items():
            query = self._queries.get(name)
            if spec.lookups and query is not None and (not query.isActive or query.status["isTriggerActive"]):
                return True
        return False

    def _reset_hint(self, root: str) -> str:
        if self._pipeline.environment.injected is not None:
            return (f"change spec.persistence.resetNonce of PersistentPipeline {self._config.pipeline}: it starts "
                    "from empty state, which reads the table's current contents and then its changes")
        return f"`python -m spark_app reset {root} --yes`, then start it again"

    def report(self, status: contract.DriverReport | None = None) -> None:
        if self._reporter is not None:
            self._reporter.report(status or self._status())

    def _status(self) -> contract.DriverReport:
        queries = {}
        for name in self._pipeline.queries:
            query = self._queries.get(name)
            status: dict[str, Any]
            progress: dict[str, Any]
            try:
                status = query.status if query else {}
                progress = last_progress(query) if query else {}
            except Exception:  # noqa: BLE001 - the query may be restarting
                status, progress = {}, {}
            head = self._session.heads.get(name) if self._session else None
            sources = head.sources.values() if head else []
            queries[name] = contract.QueryReport(
                batch=head.batch if head else None,
                batch_time_ms=head.batch_time_ms if head else None,
                commit_time_ms=head.commit_time_ms if head else None,
                offsets=head.offsets if head else {},
                malformed=sum(c.get("malformed", 0) for c in sources),
                file_problems=sum(c.get("file_problems", 0) for c in sources),
                iterate=head.iterate if head else None,
                lag=query_lag(name, self._pipeline.queries[name].sources, set(self._pipeline.kafka), progress,
                              head.offsets if head else {}),
                active=bool(status.get("isTriggerActive")),
                backlog=bool(status.get("isDataAvailable")),
                input_rows_per_s=progress.get("inputRowsPerSecond"),
            )
        session = self._session
        tables = {}
        for spec in self._pipeline.queries.values():
            for output in spec.sink.outputs():
                report = output.table_report()
                if report is not None:
                    tables[output.name] = report
        backfills = {}
        for planner in self._planners:
            shown = planner.progress()
            if shown is not None:
                backfills[planner.persistent_id] = contract.BackfillReport(**asdict(shown))
        return contract.DriverReport(state=self._state, epoch=session.epoch if session else None,
                                     stored_epoch=session.previous_epoch if session else None, queries=queries,
                                     backfills=backfills, tables=tables)

    # ---- used by the batch handlers ----------------------------------------------------

    @property
    def session(self) -> StateSession:
        assert self._session is not None
        return self._session

    def commit(self, name: str, head: QueryHead, kind: str = "commit") -> None:
        with self._commit_lock:
            self.session.commit(name, head, kind)
        self.report()

    def tables_committed(self, name: str, head: QueryHead) -> None:
        if self._readers is not None:
            self._readers.committed(name, head, self._pipeline.queries[name].tables)

    def table_uri(self, persistent_id: str) -> str:
        return self._pipeline.shared[persistent_id].location.uri

    def record_fatal(self, error: BaseException) -> None:
        if exit_code_for(error) != contract.EXIT_FAILED:
            self._fatal = self._fatal or error

    @property
    def snapshot_interval_s(self) -> float:
        return self._config.snapshot_interval_ms / 1000

    def snapshot_state_stores(self, name: str) -> None:
        state_stores.snapshot_now(self._pipeline.spark(), join("checkpoints", name))


class LiveSettingsFile:
    """The settings the operator changes while the driver runs (contract.LIVE_SETTINGS_FILE),
    read again when the file changes. A file that cannot be parsed keeps the last good
    settings, with one warning."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._seen: tuple[float, int] | None = None
        self._settings = contract.LiveSettings()

    def backfill_rate(self, pid: str) -> LiveRate | None:
        rates = self._read().backfill_rates
        return LiveRate(rates[pid]) if pid in rates else None

    def _read(self) -> contract.LiveSettings:
        if self._path is None:
            return self._settings
        try:
            stat = os.stat(self._path)
        except OSError:
            return self._settings
        if self._seen != (stat.st_mtime, stat.st_size):
            self._seen = (stat.st_mtime, stat.st_size)
            try:
                with open(self._path) as handle:
                    self._settings = contract.LiveSettings.from_json(handle.read())
            except (OSError, contract.ContractError) as error:
                log.warning("ignoring the live settings in %s: %s", self._path, error)
        return self._settings


@dataclass
class _Restarts:
    count: int = 0
    started: float | None = None
    since: float = 0.0


def apply_runtime_conf(spark: SparkSession, conf: dict[str, str], requested: Mapping[str, str]) -> None:
    """Applies what can still change after the session started; warns about what the user
    ``requested`` but cannot take effect any more."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    started = dict(spark.sparkContext.getConf().getAll())
    for key, value in conf.items():
        if key.startswith("spark.hadoop."):
            hadoop.set(key.removeprefix("spark.hadoop."), value)
            continue
        # A SQL setting is read from the session, where a static one that the session was not
        # built with has its default: the SparkConf it started with does not list it.
        current = spark.conf.get(key, None) if key.startswith("spark.sql.") else started.get(key, value)
        if current == value or (key in AHEAD_OF_THE_USERS and current is not None and current.endswith(value)):
            continue
        if key.startswith("spark.sql.") and spark.conf.isModifiable(key):
            spark.conf.set(key, value)
        elif key in requested:
            log.warning("Spark setting %s=%s takes effect only when set before the first source is read "
                        "(e.g. in %s); the session runs with %s", key, value, contract.SPARK_CONF,
                        "its default" if current is None else current)


class QueryFailed(Exception):
    """A query failed with an error that retrying in this process will not fix."""


# Failures of storage or of the network that a restart of the query may get past. Anything
# else ends the driver, and the operator's restart policy takes over.
_TRANSIENT_MARKERS = (
    "StorageUnavailable",
    "java.net.ConnectException",
    "Connection refused",
    "SocketTimeoutException",
    "UnknownHostException",
    "SdkClientException",
    "Unable to execute HTTP request",
    "AWSStatus500Exception",
    "AWSServiceThrottledException",
    "503 Service Unavailable",
    "No space left on device",
    "EndpointConnectionError",
    # A driver of a lower epoch that has not yet noticed it is fenced (it does within one
    # lease renewal) may still be writing Spark's checkpoint: running the query, or planning
    # the next batch. If it wrote that batch's offsets first, this driver's query fails with
    # CONCURRENT_STREAM_LOG_UPDATE; restarted, it reads those offsets and runs the batch
    # itself (the lower epoch can no longer commit it).
    "Multiple streaming queries are concurrently using",
    "CONCURRENT_STREAM_LOG_UPDATE",
    # A Kafka broker that did not answer in time (down, or being restarted); a Kafka output's
    # batch the broker did not take.
    "org.apache.kafka.common.errors.TimeoutException",
    "KafkaWriteFailed",
    # Spark 4.1's Kafka source fails the progress report of a batch replayed after a restart
    # (SPARK-55271: its metrics read latest offsets it never fetched), after the batch is in
    # Spark's commit log: the query restarted from there plans the next batch as usual.
    'because the return value of "scala.Option.get()" is null',
    # A Python worker (a source's reader, an output's encoder) that Spark started did not
    # connect back within its timeout: a loaded node. Seen ending a driver with exit code 1
    # while its other query was being fenced, which then never reported EXIT_FENCED.
    "Python worker failed to connect back",
)


def _looks_transient(text: str) -> bool:
    return any(marker in text for marker in _TRANSIENT_MARKERS)


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return text


def _describe_heads(heads: dict[str, QueryHead]) -> str:
    return ", ".join(f"{n} batch {h.batch}" for n, h in sorted(heads.items())) or "no batch committed"


def query_lag(query: str, sources: tuple[str, ...], kafka: set[str], progress: Mapping[str, Any],
              committed: Mapping[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """Per Kafka source of a query, what its partitions hold beyond the ``committed`` offsets:
    the latest offsets Spark saw last (its progress lists its sources as its offset log
    does, so offsets_by_source names them)."""
    if not any(pid in kafka for pid in sources):
        return {}
    lines = [_offset_line(source.get("latestOffset")) for source in progress.get("sources") or []]
    latest = offsets_by_source(query, sources, lines)
    return {pid: kafka_lag(parse_offsets(offset), parse_offsets(committed.get(pid, {})))
            for pid, offset in latest.items() if pid in kafka}


def last_progress(query: Any) -> dict[str, Any]:
    """A query's last progress report as Spark wrote it (JSON), or {} before its first.
    Not pyspark's StreamingQueryProgress as such: that keeps each source's offsets as str()
    of the parsed JSON, Python's repr, which no offset reader can parse."""
    progress = query.lastProgress
    return json.loads(progress.json) if progress else {}


def _offset_line(offset: Any) -> str:
    """A source's offset in a progress report, as the offset log writes it ("-": none yet)."""
    if offset is None or offset == "null":
        return "-"
    return offset if isinstance(offset, str) else json.dumps(offset)
