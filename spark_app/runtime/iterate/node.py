"""The iterate operator as a sink: each batch of input changes updates the stored fixed
point, and the outputs receive only the rows that changed.

Per batch, inside the batch's commit: the changes of every input (and initial) table are
appended to the tables' logs; ``policy.decide`` picks how to start; the fixed point is
computed from that start; the new F is stored as a new Delta version; the difference
between what the outputs were last given and the new F goes to the outputs; and the
commit records the versions, the decision and the iteration count. After a restart the
stored F is checked once (``start``): reused with zero iterations when nothing changed,
recomputed when the step changed or the last run stopped at its limit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_app.faults import IN_ITERATION, crash_point
from spark_app.runtime.iterate.engine import Convergence, Step, max_change, run_fixed_point
from spark_app.runtime.iterate.policy import Change, Decision, Kind, Mode, Stored, decide
from spark_app.runtime.iterate.store import DIFF, IterateStore, TableRef, fold, locations, log_refs, netted
from spark_app.runtime.sinks.base import Batch, Output, OutputContext, Sink, Written
from spark_app.state.records import QueryHead

log = logging.getLogger("spark_app.iterate")

TABLE = "_table"
ROW = "_row"


@dataclass(frozen=True)
class IterateSpec:
    """Everything the user declared with ``spark_app.iterate``."""

    persistent_id: str
    step: Step
    tables: Mapping[str, DataFrame]
    """Every table passed: the iterated tables' initial contents and the step's inputs."""
    iterated: tuple[str, ...]
    schemas: Mapping[str, StructType]
    """Schema of every table, and of the iterated tables' results."""
    kind: Kind
    limit: int | None
    convergence: Convergence
    invalidate: Callable[..., Mapping[str, DataFrame]] | None
    fingerprint: str
    streaming: tuple[str, ...]
    """The tables whose changes arrive in batches; the others are static and compared with
    their stored contents at start-up."""


@dataclass
class _Cached:
    """The committed state, kept in memory between batches so each batch reads only its changes."""

    meta: dict[str, Any]
    contents: dict[str, DataFrame] = field(default_factory=dict)
    result: dict[str, DataFrame] = field(default_factory=dict)
    emitted: dict[str, DataFrame] = field(default_factory=dict)


class IterateSink(Sink):
    kind = "iterate"

    def __init__(self, spec: IterateSpec, spark: SparkSession) -> None:
        self.spec = spec
        self._spark = spark
        self.downstream: dict[str, list[tuple[Output, tuple[str, ...] | None]]] = {n: [] for n in spec.iterated}
        self._store: IterateStore | None = None
        self._committed = _Cached(meta={})
        self._pending: _Cached | None = None
        self._fresh: set[str] = set()

    # ---- wiring ------------------------------------------------------------------------

    def attach(self, table: str, output: Output, columns: tuple[str, ...] | None = None) -> None:
        """Feeds ``output`` the changes of ``table`` (of its ``columns`` only, if given)."""
        self.downstream[table].append((output, columns))

    def outputs(self) -> list[Output]:
        return [o for outputs in self.downstream.values() for o, _ in outputs]

    def recover(self, head: QueryHead | None, context: OutputContext) -> None:
        for output in self.outputs():
            output.recover(head.outputs.get(output.name) if head else None, context)
        # An output added to an existing iterate has seen nothing: it gets all of F.
        self._fresh = {o.name for o in self.outputs() if head is None or o.name not in head.outputs}
        self._store = IterateStore(self._spark, context.snapshots, self.spec.persistent_id, context.epoch)
        self._committed = _Cached(meta=dict(head.iterate or {}) if head else {})
        self._store.collect_garbage(locations(self._committed.meta.get("versions", {})))

    # ---- the commit protocol -------------------------------------------------------------

    def start(self, batch_time_ms: int) -> Written | None:
        """After a restart: reuse F when nothing changed, recompute when it cannot be trusted.
        Static (non-streaming) tables are compared with their stored contents here."""
        static = [name for name in self.spec.tables if name not in self.spec.streaming]
        if not self._committed.meta and not static:
            return None  # nothing stored, nothing to compare: the first batch computes F
        changes = {name: self._static_changes(name) for name in static}
        return self._run(changes, batch_id=-1, batch_time_ms=batch_time_ms, restart=True)

    def write(self, batch: Batch) -> Written:
        df = batch.df.persist()
        try:
            changes = {name: self._decode(df, name) for name in self.spec.streaming}
            return self._run(changes, batch.batch_id, batch.time_ms, restart=False)
        finally:
            df.unpersist()

    def committed(self, written: Written) -> None:
        super().committed(written)
        self._fresh -= set(written.outputs)
        if self._pending is not None:
            superseded = (locations(self._committed.meta.get("versions", {}))
                          - locations(self._pending.meta.get("versions", {})))
            self._committed = self._pending
            self._pending = None
            assert self._store is not None
            self._store.drop(superseded)

    def aborted(self) -> None:
        super().aborted()
        self._pending = None

    # ---- one run -----------------------------------------------------------------------

    def _run(self, changes: Mapping[str, DataFrame], batch_id: int, batch_time_ms: int, restart: bool) -> Written:
        assert self._store is not None
        spec, store, meta = self.spec, self._store, self._committed.meta
        clock = _Phases()
        stored = Stored(meta["fingerprint"], bool(meta["converged"])) if meta else None
        if not changes:
            decision = decide(stored, Change(0, 0), spec.fingerprint, spec.kind, spec.invalidate is not None)
            if decision.mode is Mode.REUSE:
                return self._reuse(decision, batch_id, batch_time_ms, restart, clock)
        versions: dict[str, Any] = {k: dict(v) for k, v in meta.get("versions", {"inputs": {}}).items()}
        versions.setdefault("inputs", {})
        # Changed tables are read lazily: folding the changes in materializes the kept ones once.
        previous = {name: self._contents(name, materialized=self._kept(name) and name not in changes)
                    for name in spec.tables}
        clock.lap("read inputs")
        inserted, deleted, nets, net_rows = {}, {}, {}, {}
        counted = Change(0, 0)
        for name, change in changes.items():
            nets[name] = net = netted(change).localCheckpoint(eager=True)  # inserted and deleted at once: no trace
            inserted[name] = net.where(F.col(DIFF) > 0).drop(DIFF)
            deleted[name] = net.where(F.col(DIFF) < 0).drop(DIFF)
            table = _count(net)
            net_rows[name] = table.inserted + table.deleted
            counted = Change(counted.inserted + table.inserted, counted.deleted + table.deleted)
            previous[name] = fold(previous[name], net, net_rows[name], self._nothing_stored(name),
                                  materialize=self._kept(name))
        counted_contents = previous
        clock.lap("fold changes")
        for name in changes:
            if name in spec.streaming:
                kept = store.store_changes(name, nets[name], net_rows[name], counted_contents[name],
                                           {**self._stored_input(name), "log": self._stored_version(name)})
                versions["inputs"][name] = kept.pop("log")
                versions.setdefault("contents", {})[name] = kept
            elif counted.inserted or counted.deleted:
                versions["inputs"][name] = store.replace_contents(name, counted_contents[name].drop(DIFF)).to_json()
        contents = {name: df.drop(DIFF) for name, df in counted_contents.items()}
        clock.lap("store changes")
        decision = decide(stored, counted, spec.fingerprint, spec.kind, spec.invalidate is not None)
        log.info("iterate %s: %s (%s)", spec.persistent_id, decision.mode.value, decision.reason)
        inputs = {name: df for name, df in contents.items() if name not in spec.iterated}
        result, iterations, converged, seconds = self._fixed_point(decision, contents, inputs, inserted, deleted,
                                                                   batch_id)
        clock.lap("iterations")
        for name, df in result.items():
            versions.setdefault("result", {})[name] = store.write("result", name, df).to_json()
        clock.lap("store result")
        previously_emitted = {name: self._emitted(name) for name in result}
        emitted = self._emit(result)
        for name, df in emitted.items():
            if spec.convergence.tolerance is not None:
                versions.setdefault("emitted", {})[name] = store.write("emitted", name, df).to_json()
        outputs = self._write_outputs(previously_emitted, emitted, batch_id, batch_time_ms)
        clock.lap("emit changes")
        new_meta = self._meta(meta, decision, iterations, converged, seconds, versions, result, restart)
        new_meta["run_seconds"] = round(clock.total(), 3)
        new_meta["phases"] = clock.laps()
        log.info("iterate %s: %s", spec.persistent_id, clock)
        kept = {name: df for name, df in counted_contents.items() if self._kept(name)}
        self._pending = _Cached(new_meta, kept, result, emitted)
        return Written(outputs, new_meta)

    def _reuse(self, decision: Decision, batch_id: int, batch_time_ms: int, restart: bool, clock: _Phases) -> Written:
        """Nothing changed and F can be trusted: zero iterations, nothing read but what a
        newly added output needs."""
        meta = self._committed.meta
        emitted = {name: self._emitted(name) for name in self.spec.iterated
                   if any(o.name in self._fresh for o, _ in self.downstream[name])}
        outputs = self._write_outputs(emitted, emitted, batch_id, batch_time_ms)
        clock.lap("emit to new outputs")
        runs = dict(meta.get("runs", {}))
        runs[Mode.REUSE.value] = runs.get(Mode.REUSE.value, 0) + 1
        new_meta = {**meta, "decision": decision.mode.value, "reason": decision.reason, "iterations": 0,
                    "seconds": 0.0, "time_ms": int(time.time() * 1000), "at_restart": restart, "runs": runs,
                    "run_seconds": round(clock.total(), 3), "phases": clock.laps()}
        log.info("iterate %s: reused the stored fixed point (%s)", self.spec.persistent_id, clock)
        self._pending = _Cached(new_meta, self._committed.contents, self._committed.result, self._committed.emitted)
        return Written(outputs, new_meta)

    def _write_outputs(self, before: Mapping[str, DataFrame], after: Mapping[str, DataFrame], batch_id: int,
                       batch_time_ms: int) -> dict[str, Any]:
        """Gives each output the changelog from what it holds (``before``, or nothing for a new
        output) to ``after``, in the columns it takes."""
        heads = {}
        for name, new in after.items():
            for output, columns in self.downstream[name]:
                if output.name in self._fresh:
                    rows = _project(new, columns).withColumn("diff", F.lit(1))
                elif before[name] is new:
                    continue
                else:
                    rows = _changes(_project(before[name], columns), _project(new, columns))
                heads[output.name] = output.write(Batch(batch_id, batch_time_ms, rows, changelog=True))
        return heads

    def _progress(self, iteration: int, batch_id: int) -> None:
        if iteration % 10 == 0:
            log.info("iterate %s: iteration %d", self.spec.persistent_id, iteration)
        crash_point(IN_ITERATION, batch_id)

    def _fixed_point(self, decision: Decision, contents: Mapping[str, DataFrame], inputs: Mapping[str, DataFrame],
                     inserted: Mapping[str, DataFrame], deleted: Mapping[str, DataFrame], batch_id: int,
                     ) -> tuple[dict[str, DataFrame], int, bool, float]:
        spec = self.spec
        if decision.mode is Mode.REUSE:
            return {n: self._result(n) for n in spec.iterated}, 0, True, 0.0
        cold = decision.mode is Mode.COLD
        if cold:
            start = {n: contents[n] for n in spec.iterated}
            fresh = {n: contents[n] for n in inputs}
            changed = start
        else:
            start = {n: self._warm_start(n, contents[n], inserted.get(n), decision, deleted, inputs)
                     for n in spec.iterated}
            fresh = {n: inserted.get(n, contents[n].limit(0)) for n in inputs}
            changed = start if decision.mode is Mode.PARTIAL or spec.kind is Kind.CONTRACTION else {
                n: inserted.get(n, contents[n].limit(0)) for n in spec.iterated}
        outcome = run_fixed_point(
            spec.step, start, inputs, fresh, changed, spec.limit, spec.convergence, cold,
            progress=lambda i: self._progress(i, batch_id),
        )
        if not outcome.converged:
            log.warning("iterate %s stopped at its limit of %d iterations without converging; the result is "
                        "stored but will not be trusted for a warm start", spec.persistent_id, spec.limit)
        log.info("iterate %s: %d iterations in %.1fs", spec.persistent_id, outcome.iterations, outcome.seconds)
        return outcome.tables, outcome.iterations, outcome.converged, outcome.seconds

    def _warm_start(self, name: str, initial: DataFrame, inserted: DataFrame | None, decision: Decision,
                    deleted: Mapping[str, DataFrame], inputs: Mapping[str, DataFrame]) -> DataFrame:
        stored = self._result(name)
        if decision.mode is Mode.PARTIAL:
            assert self.spec.invalidate is not None
            reset = self.spec.invalidate(**{n: self._result(n) for n in self.spec.iterated},
                                         deleted=deleted, **inputs)
            stored = stored.subtract(reset[name].select(*stored.columns)) if name in reset else stored
            return stored.unionByName(initial)
        if inserted is None:
            return stored
        key = self.spec.convergence.key.get(name)
        if key and self.spec.convergence.tolerance is not None:
            # A contraction keeps one row per key: new keys start from their initial row.
            return stored.unionByName(inserted.join(stored.select(*key), on=list(key), how="left_anti"))
        return stored.unionByName(inserted)

    def _emit(self, result: Mapping[str, DataFrame]) -> dict[str, DataFrame]:
        """What the outputs will hold: F, except that a contraction's changes below the
        tolerance keep the value last emitted."""
        emitted = dict(result)  # materialized by the loop, or read back and materialized
        for name, new in result.items():
            key = self.spec.convergence.key.get(name)
            if self.spec.convergence.tolerance is not None and key:
                held = _hold_small_changes(self._emitted(name), new, key, self.spec.convergence.tolerance)
                emitted[name] = held.localCheckpoint(eager=True)
        return emitted

    # ---- the committed state -------------------------------------------------------------

    def _contents(self, name: str, materialized: bool = True) -> DataFrame:
        """A table's committed rows with their multiplicities; read from the store after a
        restart, and kept (materialized) only if ``materialized``."""
        if name in self._committed.contents:
            return self._committed.contents[name]
        assert self._store is not None
        stored = self._stored_input(name)
        read = self._store.read_contents(name, TableRef.from_json(stored.get("snapshot"), "contents", name),
                                         log_refs(self._stored_version(name), name), stored.get("logged"),
                                         self.spec.schemas[name], materialize=materialized)
        if materialized:
            self._committed.contents[name] = read
        return read

    def _kept(self, name: str) -> bool:
        """Whether a table's contents are kept in memory between batches. The step reads its
        inputs on every iteration, and a static table is compared at each start; an iterated
        streaming table's contents are needed only to start cold or to reset part of F, so
        they are read from the store (a snapshot and a log) only then."""
        return name not in self.spec.iterated or name not in self.spec.streaming

    def _stored_version(self, name: str) -> Any:
        """A streaming table's log (a list of segments), or a static table's contents."""
        return self._committed.meta.get("versions", {}).get("inputs", {}).get(name)

    def _stored_input(self, name: str) -> dict[str, Any]:
        """A streaming table's last snapshot: version, rows, and the log's length since."""
        return dict(self._committed.meta.get("versions", {}).get("contents", {}).get(name, {}))

    def _nothing_stored(self, name: str) -> bool:
        return name not in self._committed.contents and self._stored_version(name) is None

    def _result(self, name: str) -> DataFrame:
        if name not in self._committed.result:
            self._committed.result[name] = self._read("result", name)
        return self._committed.result[name]

    def _emitted(self, name: str) -> DataFrame:
        if self.spec.convergence.tolerance is None:
            return self._result(name)
        if name not in self._committed.emitted:
            self._committed.emitted[name] = self._read("emitted", name)
        return self._committed.emitted[name]

    def _read(self, kind: str, name: str) -> DataFrame:
        assert self._store is not None
        ref = TableRef.from_json(self._committed.meta.get("versions", {}).get(kind, {}).get(name), kind, name)
        return self._store.read(ref, self.spec.schemas[f"result:{name}"]).localCheckpoint(eager=True)

    def _decode(self, df: DataFrame, name: str) -> DataFrame:
        schema = self.spec.schemas[name]
        return (df.where(F.col(TABLE) == name)
                .select(F.from_json(ROW, schema).alias("r"), F.col(DIFF))
                .select("r.*", DIFF))

    def _static_changes(self, name: str) -> DataFrame:
        """A static table's changes: its current rows against the stored contents."""
        current = self.spec.tables[name].distinct()
        stored = self._contents(name).drop(DIFF)
        return (current.subtract(stored).withColumn(DIFF, F.lit(1))
                .unionByName(stored.subtract(current).withColumn(DIFF, F.lit(-1))))

    def _meta(self, previous: Mapping[str, Any], decision: Decision, iterations: int, converged: bool,
              seconds: float, versions: dict[str, Any], result: Mapping[str, DataFrame], restart: bool,
              ) -> dict[str, Any]:
        runs = dict(previous.get("runs", {}))
        runs[decision.mode.value] = runs.get(decision.mode.value, 0) + 1
        return {
            "persistent_id": self.spec.persistent_id,
            "fingerprint": self.spec.fingerprint,
            "converged": converged,
            "decision": decision.mode.value,
            "reason": decision.reason,
            "iterations": iterations,
            "seconds": round(seconds, 3),
            "time_ms": int(time.time() * 1000),
            "at_restart": restart,
            "rows": {name: df.count() for name, df in result.items()},
            "runs": runs,
            "versions": versions,
        }


def _count(change: DataFrame) -> Change:
    row = change.agg(F.sum(F.when(F.col(DIFF) > 0, 1).otherwise(0)).alias("inserted"),
                     F.sum(F.when(F.col(DIFF) < 0, 1).otherwise(0)).alias("deleted")).first()
    if row is None:  # an aggregate without grouping always has its one row
        return Change(0, 0)
    return Change(int(row["inserted"] or 0), int(row["deleted"] or 0))


class _Phases:
    """Wall time per phase of a run, for the log line that ends it and the commit."""

    def __init__(self) -> None:
        self._began = self._last = time.monotonic()
        self._laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self._laps[name] = round(now - self._last, 3)
        self._last = now

    def laps(self) -> dict[str, float]:
        return dict(self._laps)

    def total(self) -> float:
        return self._last - self._began

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.1f}s" for name, seconds in self._laps.items())


def _project(df: DataFrame, columns: tuple[str, ...] | None) -> DataFrame:
    return df if columns is None else df.select(*columns).distinct()


def _changes(before: DataFrame, after: DataFrame) -> DataFrame:
    """The changelog from ``before`` to ``after``, both sets: one shuffle of both, where
    two set differences would shuffle each of them twice."""
    both = before.withColumn("diff", F.lit(-1)).unionByName(after.withColumn("diff", F.lit(1)))
    return netted(both, "diff")


def _hold_small_changes(old: DataFrame, new: DataFrame, key: tuple[str, ...], tolerance: float) -> DataFrame:
    """For a contraction: rows whose values moved by at most ``tolerance`` keep the value
    last emitted, so that the outputs see no change below the tolerance."""
    if old.isEmpty():
        return new
    values = [c for c in new.columns if c not in key]
    joined = new.alias("n").join(old.alias("o"), on=list(key), how="left")
    small = F.lit(True)
    for value in values:
        small = small & F.col(f"o.{value}").isNotNull() & (F.abs(F.col(f"n.{value}") - F.col(f"o.{value}")) <= tolerance)
    return joined.select(*key, *[F.when(small, F.col(f"o.{v}")).otherwise(F.col(f"n.{v}")).alias(v) for v in values])


__all__ = ["IterateSink", "IterateSpec", "max_change"]
