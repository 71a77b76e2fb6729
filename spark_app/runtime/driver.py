"""Running a declared pipeline: one Spark streaming query per output, one commit per batch.

For each batch of each query, in Spark's foreachBatch:

1. If the metadata log already holds this batch's commit, the batch is a replay (the
   driver died after committing but before Spark recorded the batch): nothing is written.
2. The output writes the batch durably at its committed position, cutting off anything
   a crashed attempt left beyond it.
3. The commit record (the sources' offsets from Spark's offset log, the output's new
   position, the malformed-row counters) is appended to the metadata log. This is the
   commit: a restart resumes from the newest one.
4. The output releases what it held for the batch; Spark then records the batch in its
   own commit log and moves on.

A driver superseded by a higher epoch fails at step 3 (or earlier, at the fencing
check) and exits without committing. SIGTERM lets the batch in flight finish, then
stops; a batch that cannot finish in time is abandoned and replayed by the next driver.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_app import contract
from spark_app.persistence import Backend, Config
from spark_app.runtime.faults import AFTER_COMMIT, AFTER_OUTPUT, crash_point
from spark_app.runtime.file_source import SourceOrderChanged, count_dead_letters
from spark_app.runtime.outputs import Batch, DeltaOutput, OutputDamaged, Written
from spark_app.runtime.pipeline import Pipeline, PipelineError, QuerySpec
from spark_app.runtime.plan import KeyNotInOutput
from spark_app.runtime.reporting import PodReporter
from spark_app.runtime.session import spark_conf
from spark_app.state.file_index import FileIndex
from spark_app.state.identity import IncompatibleChange
from spark_app.state.records import QueryHead
from spark_app.state.session import AlreadyRunning, Fenced, Holder, StaleEpoch, StateSession
from spark_app.storage import NotFound, Storage, StorageMisconfigured, StorageUnavailable, join

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
]


class StateDamaged(Exception):
    """The metadata log and Spark's checkpoint disagree (part of the state was deleted)."""


_EXIT_CODES.append((StateDamaged, contract.EXIT_MISCONFIGURED))


@dataclass(frozen=True)
class RunOptions:
    trigger_interval_ms: int = 1000
    """How often each query looks for new input."""
    stop_when_idle: bool = False
    """Stop once every source's available input is processed and committed (a batch run)."""
    stop_timeout_s: float = 20.0
    """On SIGTERM, how long the batch in flight may take to finish before it is abandoned."""
    outage_budget_s: float = 900.0
    """How long a query keeps being restarted after failures that may be transient
    (storage outages), counted from the first failure since the last commit."""
    lease_renew_s: float = 5.0


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
        self._stop = threading.Event()
        self._stop_reason = ""
        self._fatal: BaseException | None = None
        self._commit_lock = threading.Lock()
        self._session: StateSession | None = None
        self._reporter: PodReporter | None = None
        self._state = "starting"

    # ---- lifecycle -------------------------------------------------------------------

    def run(self) -> int:
        """Runs until stopped; returns the process exit code (see spark_app.contract)."""
        if not self._pipeline.queries:
            raise PipelineError("the pipeline has no outputs: declare one with spark_app.io.<format>.write(...)")
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
        self._stop_reason = self._stop_reason or reason
        self._stop.set()

    def _start(self) -> None:
        config = self._config
        metadata = config.metadata_storage.storage()
        snapshots = config.snapshot_storage.storage()
        snapshots.check_writable()
        spark = self._pipeline.spark()
        apply_runtime_conf(spark, spark_conf(config.snapshot_storage, config.snapshot_interval_ms, config.spark_conf),
                           requested=config.spark_conf)
        holder = Holder.this_process(config.pipeline or os.path.basename(os.environ.get("SPARK_APP_PIPELINE_FILE", "")))
        self._reporter = PodReporter.from_env()
        self._session = StateSession.open(metadata, self._pipeline.manifest(), holder=holder,
                                          requested_epoch=config.epoch)
        self.report()
        streaming = {n for n, q in self._pipeline.queries.items() if q.df is not None}
        _check_checkpoints(snapshots, {n: h for n, h in self._session.heads.items() if n in streaming})
        dead_letter = Backend.from_uri(
            config.dead_letter_uri or self._pipeline.default_dead_letter(),
            endpoint_url=config.snapshot_storage.endpoint_url, region=config.snapshot_storage.region,
            path_style=config.snapshot_storage.path_style if config.snapshot_storage.kind == "s3" else None,
        )
        self._pipeline.write_context(config.snapshot_storage, dead_letter)
        for number, (name, spec) in enumerate(self._pipeline.queries.items()):
            handler = BatchHandler(name, spec, self, snapshots, dead_letter)
            self._handlers[name] = handler
            self._start_query(name)
            if number == 0 and len(self._pipeline.queries) > 1 and name in self._queries:
                self._wait_for_first_trigger(name)
        threading.Thread(target=self._renew_lease_forever, name="spark_app-lease", daemon=True).start()
        self._state = "running"
        log.info("pipeline running at epoch %d: %s", self._session.epoch, ", ".join(
            f"{o.name} -> {o.path}" for q in self._pipeline.queries.values() for o in q.sink.outputs()))

    def _start_query(self, name: str) -> None:
        spec = self._pipeline.queries[name]
        handler = self._handlers[name]
        handler.recover()
        if spec.df is None:
            return  # nothing streams into it: recover() did its one run
        query = (
            spec.df.writeStream.queryName(name)
            .outputMode(spec.facts.output_mode)
            .option("checkpointLocation", handler.checkpoint_uri)
            .trigger(processingTime=f"{self._options.trigger_interval_ms} milliseconds")
            .foreachBatch(handler)
            .start()
        )
        self._queries[name] = query

    def _wait_for_first_trigger(self, name: str, timeout_s: float = 300) -> None:
        """Lets the first query plan its first batch before the others start.

        Spark's PythonStreamingSourceRunner.init adds entries to the environment map of the
        data source's PythonFunction, which every query shares and which tasks serialize;
        a query starting while another serializes tasks can corrupt them
        (java.io.OptionalDataException). Once the first runner has added the entries,
        later runners only overwrite them with equal values, which is harmless.
        """
        query = self._queries[name]
        deadline = time.monotonic() + timeout_s
        while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
            if self._stop.wait(0.1):
                return

    def _supervise(self) -> None:
        idle_since: float | None = None
        restarts: dict[str, _Restarts] = {name: _Restarts() for name in self._queries}
        while not self._stop.is_set():
            if self._fatal is not None:
                raise self._fatal
            for name, query in list(self._queries.items()):
                if not query.isActive:
                    self._restart_or_raise(name, query, restarts[name])
                elif self._handlers[name].committed_since(restarts[name].since):
                    restarts[name] = _Restarts()
            if self._options.stop_when_idle:
                if self._idle():
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since >= 2 * self._options.trigger_interval_ms / 1000:
                        self.request_stop("all available input is processed")
                else:
                    idle_since = None
            self._stop.wait(0.2)

    def _restart_or_raise(self, name: str, query: StreamingQuery, restarts: _Restarts) -> None:
        if self._fatal is not None:
            raise self._fatal
        error = query.exception()
        if error is None:
            raise RuntimeError(f"query {name} stopped by itself")
        message = _first_line(str(error))
        if not _looks_transient(str(error)):
            raise QueryFailed(f"query {name} failed: {message}")
        if restarts.started is None:
            restarts.started = time.monotonic()
        elapsed = time.monotonic() - restarts.started
        if elapsed > self._options.outage_budget_s:
            raise RuntimeError(f"query {name} kept failing for {elapsed:.0f}s; last error: {message}")
        delay = min(30.0, 0.5 * 2 ** restarts.count)
        restarts.count += 1
        log.warning("query %s failed (%s); restarting it from its last commit in %.1fs (attempt %d)",
                    name, message, delay, restarts.count)
        if self._stop.wait(delay):
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
        log.info("stopping: %s", self._stop_reason)
        self._state = "stopping"
        self._stop_queries(self._options.stop_timeout_s)
        if self._fatal is not None:
            raise self._fatal
        assert self._session is not None
        self._session.close(self._stop_reason)
        self._close_outputs()
        log.info("stopped cleanly at %s", _describe_heads(self._session.heads))
        return contract.EXIT_OK

    def _stop_queries(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for name, query in self._queries.items():
            while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
                time.sleep(0.05)
            if query.isActive and query.status["isTriggerActive"]:
                log.warning("query %s: abandoning the batch in flight; the next driver replays it", name)
            query.stop()

    def _fail(self, error: BaseException) -> int:
        code = exit_code_for(error)
        message = str(error) if code != contract.EXIT_FAILED else f"{type(error).__name__}: {_first_line(str(error))}"
        if code == contract.EXIT_FAILED:
            log.exception("pipeline failed")
        else:
            log.error("%s", error)
        for query in self._queries.values():
            try:
                query.stop()
            except Exception:  # noqa: BLE001 - already failing; report the first error
                pass
        self._close_outputs()
        write_termination_message(message)
        return code

    def _close_outputs(self) -> None:
        for spec in self._pipeline.queries.values():
            spec.sink.close()

    def _install_signal_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda s, _f: self.request_stop(f"received {signal.Signals(s).name}"))
        return previous

    def _renew_lease_forever(self) -> None:
        assert self._session is not None
        while not self._stop.wait(self._options.lease_renew_s):
            try:
                status = self._status()
                self._session.renew_lease(status=status)
                self.report(status)
            except Fenced as error:
                self._fatal = error
                return
            except StorageUnavailable as error:
                log.warning("could not renew the lease: %s", error)

    def report(self, status: dict[str, Any] | None = None) -> None:
        if self._reporter is not None:
            self._reporter.report(status or self._status())

    def _status(self) -> dict[str, Any]:
        queries = {}
        for name in self._pipeline.queries:
            query = self._queries.get(name)
            try:
                status = query.status if query else {}
                progress = (query.lastProgress if query else None) or {}
            except Exception:  # noqa: BLE001 - the query may be restarting
                status, progress = {}, {}
            head = self._session.heads.get(name) if self._session else None
            queries[name] = {
                "batch": head.batch if head else None,
                "batch_time_ms": head.batch_time_ms if head else None,
                "commit_time_ms": head.commit_time_ms if head else None,
                "offsets": head.offsets if head else {},
                "malformed": sum(c.get("malformed", 0) for c in head.sources.values()) if head else 0,
                "iterate": head.iterate if head else None,
                "active": bool(status.get("isTriggerActive")),
                "backlog": bool(status.get("isDataAvailable")),
                "input_rows_per_s": progress.get("inputRowsPerSecond"),
            }
        session = self._session
        return {"state": self._state, "epoch": session.epoch if session else None,
                "stored_epoch": session.previous_epoch if session else None, "queries": queries}

    # ---- used by the batch handlers ----------------------------------------------------

    @property
    def session(self) -> StateSession:
        assert self._session is not None
        return self._session

    def commit(self, name: str, head: QueryHead, kind: str = "commit") -> None:
        with self._commit_lock:
            self.session.commit(name, head, kind)
        self.report()

    def record_fatal(self, error: BaseException) -> None:
        if exit_code_for(error) != contract.EXIT_FAILED:
            self._fatal = self._fatal or error

    @property
    def snapshot_interval_s(self) -> float:
        return self._config.snapshot_interval_ms / 1000


@dataclass
class _Restarts:
    count: int = 0
    started: float | None = None
    since: float = 0.0


class BatchHandler:
    """Spark's foreachBatch callback for one query: the per-batch commit protocol."""

    def __init__(self, name: str, spec: QuerySpec, driver: Driver, snapshots: Storage,
                 dead_letter: Backend) -> None:
        self._name = name
        self._spec = spec
        self._driver = driver
        self._snapshots = snapshots
        self._dead_letter = dead_letter
        self._indexes = {pid: FileIndex(snapshots, pid) for pid in spec.sources}
        self._last_commit = 0.0
        self._last_snapshot = time.monotonic()
        self.checkpoint_uri = snapshots.spark_uri(join("checkpoints", name))

    def recover(self) -> None:
        """Aligns the sink with the last commit, then commits the sink's start-up work (an
        iterate operator checking its stored fixed point) as its own record."""
        head = self._driver.session.heads.get(self._name)
        sink = self._spec.sink
        for output in sink.outputs():
            if isinstance(output, DeltaOutput):
                output.bind(f"spark_app-{self._driver.session.state_id}-{output.name}")
        sink.recover(head, self._snapshots)
        written = sink.start(int(time.time() * 1000))
        if written is not None:
            self._commit(written, head, head.batch if head else -1, int(time.time() * 1000),
                         head.offsets if head else {}, kind="start")

    def committed_since(self, moment: float) -> bool:
        return self._last_commit > moment

    def caught_up(self) -> bool:
        head = self._driver.session.heads.get(self._name)
        for pid, index in self._indexes.items():
            index.reload()
            done = int(head.offsets.get(pid, {}).get("files", 0)) if head else 0
            if done < len(index):
                return False
        return True

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        try:
            self._handle(df, batch_id)
        except BaseException as error:
            self._driver.record_fatal(error)
            raise

    def _handle(self, df: DataFrame, batch_id: int) -> None:
        session = self._driver.session
        head = session.heads.get(self._name)
        if head is not None and batch_id <= head.batch:
            # The outputs have this batch already; the batch still runs, because Spark
            # commits the stateful operators' new state version only when the batch's plan
            # executes (and refuses to move on otherwise: STATE_STORE_COMMIT_VALIDATION_FAILED).
            log.info("query %s: batch %d is already committed; replaying it without output", self._name, batch_id)
            df.write.format("noop").mode("overwrite").save()
            return
        batch_time_ms, offsets = self._read_offsets(batch_id)
        session.check_not_fenced()
        try:
            written = self._spec.sink.write(Batch(batch_id, batch_time_ms, df))
        except BaseException:
            self._spec.sink.aborted()
            raise
        crash_point(AFTER_OUTPUT, batch_id)
        new_head = self._commit(written, head, batch_id, batch_time_ms, offsets)
        crash_point(AFTER_COMMIT, batch_id)
        log.info("query %s: committed batch %d (%s)", self._name, batch_id,
                 ", ".join(f"{pid}: {o.get('files')} files" for pid, o in offsets.items()))
        self._maybe_snapshot(new_head)

    def _commit(self, written: Written, head: QueryHead | None, batch_id: int, batch_time_ms: int,
                offsets: dict[str, Any], kind: str = "commit") -> QueryHead:
        new_head = QueryHead(
            batch=batch_id,
            batch_time_ms=batch_time_ms,
            commit_time_ms=int(time.time() * 1000),
            offsets=offsets,
            outputs={**(head.outputs if head else {}), **written.outputs},
            sources=self._counters(head, offsets) if kind == "commit" else (head.sources if head else {}),
            iterate=written.iterate if written.iterate is not None else (head.iterate if head else None),
        )
        try:
            self._driver.commit(self._name, new_head, kind)
        except BaseException:
            self._spec.sink.aborted()
            raise
        self._spec.sink.committed(written)
        self._last_commit = time.monotonic()
        return new_head

    def _maybe_snapshot(self, head: QueryHead) -> None:
        if time.monotonic() - self._last_snapshot < self._driver.snapshot_interval_s:
            return
        self._last_snapshot = time.monotonic()
        outputs = dict(head.outputs)
        for output in self._spec.sink.outputs():
            if output.name in outputs:
                stored = output.snapshot(outputs[output.name], head.batch, self._snapshots)
                if stored is not None:
                    outputs[output.name] = stored
        if outputs != head.outputs:
            self._driver.commit(self._name, QueryHead(**{**head.__dict__, "outputs": outputs}), kind="snapshot")

    def _read_offsets(self, batch_id: int) -> tuple[int, dict[str, Any]]:
        key = join("checkpoints", self._name, "offsets", str(batch_id))
        try:
            lines = self._snapshots.read(key).decode().splitlines()
        except NotFound:
            raise StateDamaged(f"Spark's offset log has no entry for batch {batch_id} of {self._name}") from None
        metadata = json.loads(lines[1])
        offsets = {}
        for line in lines[2:]:
            if line and line != "-":
                offset = json.loads(line)
                offsets[offset["source"]] = offset
        return int(metadata.get("batchTimestampMs", 0)), offsets

    def _counters(self, head: QueryHead | None, offsets: dict[str, Any]) -> dict[str, dict[str, int]]:
        counters = {pid: dict(v) for pid, v in (head.sources if head else {}).items()}
        for pid, offset in offsets.items():
            start = int(head.offsets.get(pid, {}).get("files", 0)) if head else 0
            end = int(offset["files"])
            previous = counters.get(pid, {})
            files = self._indexes[pid].files(start, end) if pid in self._indexes and end > start else []
            counters[pid] = {
                "files": end,
                "malformed": previous.get("malformed", 0) + count_dead_letters(self._dead_letter, pid, files),
            }
        return counters


def apply_runtime_conf(spark: SparkSession, conf: dict[str, str], requested: Mapping[str, str]) -> None:
    """Applies what can still change after the session started; warns about what the user
    ``requested`` but cannot take effect any more."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    started = dict(spark.sparkContext.getConf().getAll())
    for key, value in conf.items():
        if key.startswith("spark.hadoop."):
            hadoop.set(key.removeprefix("spark.hadoop."), value)
        elif key.startswith("spark.sql.") and spark.conf.get(key, None) != value and spark.conf.isModifiable(key):
            spark.conf.set(key, value)
        elif key in requested and started.get(key, value) != value:
            log.warning("Spark setting %s=%s takes effect only when set before the first source is read "
                        "(e.g. in %s); the session runs with %s", key, value, contract.SPARK_CONF, started[key])


def _check_checkpoints(snapshots: Storage, heads: dict[str, QueryHead]) -> None:
    for name, head in heads.items():
        if not snapshots.list(join("checkpoints", name, "offsets") + "/"):
            raise StateDamaged(
                f"the metadata log says output {name!r} committed batch {head.batch}, but Spark's checkpoint "
                f"at {snapshots.spark_uri(join('checkpoints', name))} is gone; restore it, or reset the state"
            )


def write_termination_message(message: str) -> None:
    path = os.environ.get("SPARK_APP_TERMINATION_LOG", contract.TERMINATION_LOG)
    try:
        with open(path, "w") as handle:
            # It becomes the operator's status and Events: no credentials in it.
            handle.write(contract.scrub_credentials(message)[:4000])
    except OSError:
        pass


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
