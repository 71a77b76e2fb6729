"""The per-batch commit protocol: Spark's foreachBatch callback of one query.

For each batch:

1. If the metadata log already holds this batch's commit, the batch is a replay (the
   driver died after committing but before Spark recorded the batch): nothing is written,
   but the batch's plan still runs, so that Spark commits its operators' state.
2. The sink writes the batch durably without publishing it (a JSON-lines output stages
   it beside the output; see spark_app.runtime.sinks).
3. The commit record (the sources' offsets, read from Spark's offset log; the outputs'
   new heads; the counters of what the sources set aside) is appended to the metadata
   log. This is the commit: a restart resumes from the newest one. A superseded driver
   fails here (or earlier, at the fence check) and publishes nothing.
4. The sink publishes the batch and releases what it held; Spark then records the batch
   in its own commit log and moves on. Now and then a snapshot of the outputs' state is
   committed too.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from pyspark.sql import DataFrame

from spark_app.faults import (
    AFTER_COMMIT,
    AFTER_OUTPUT,
    AFTER_SNAPSHOT_COMMIT,
    AFTER_SNAPSHOT_WRITE,
    IN_RECOVERY,
    crash_point,
)
from spark_app.runtime.jvm import first_batch
from spark_app.runtime.pipeline import QuerySpec
from spark_app.runtime.sinks.base import Batch, OutputContext, Written
from spark_app.runtime.sources.base import Tracker
from spark_app.state.records import QueryHead
from spark_app.state.session import StateSession
from spark_app.state.tables import LookupPosition
from spark_app.storage import NotFound, Storage, join

log = logging.getLogger("spark_app")


class StateDamaged(Exception):
    """The metadata log and Spark's checkpoint disagree (part of the state was deleted)."""



class Committer(Protocol):
    """What a batch handler needs of the driver it runs in."""

    @property
    def session(self) -> StateSession: ...

    @property
    def snapshot_interval_s(self) -> float: ...

    def commit(self, name: str, head: QueryHead, kind: str = "commit") -> None: ...

    def snapshot_state_stores(self, name: str) -> None:
        """Spark's state stores of query ``name`` snapshot their last version: it is due.
        Called under the query's batch lock, so while none of its tasks runs."""

    def tables_committed(self, name: str, head: QueryHead) -> None:
        """The commit of ``head`` holds: the holds on the shared tables it read may move."""

    def table_uri(self, persistent_id: str) -> str:
        """Where Spark reads the shared table a query's input ``persistent_id`` names."""

    def record_fatal(self, error: BaseException) -> None: ...


class BatchHandler:
    """Spark's foreachBatch callback for one query: the per-batch commit protocol."""

    def __init__(self, name: str, spec: QuerySpec, driver: Committer, snapshots: Storage,
                 trackers: Mapping[str, Tracker]) -> None:
        self._name = name
        self._spec = spec
        self._driver = driver
        self._snapshots = snapshots
        self._trackers = {pid: trackers[pid] for pid in spec.sources}
        self._last_commit = 0.0
        self._last_snapshot = time.monotonic()
        self._snapshot_of = -1
        """The batch the newest snapshot under way or stored was taken at."""
        self._batch_lock = threading.Lock()
        """Held through a batch, and by the work done between batches (``between_batches``)."""
        self.codegen_after_first_batch = False
        """The query started without whole-stage code generation (jvm.first_batch): turn it on
        once a batch is done."""
        self.checkpoint_uri = snapshots.spark_uri(join("checkpoints", name))

    def recover(self) -> None:
        """Aligns the sink with the last commit, then commits the sink's start-up work (an
        iterate operator checking its stored fixed point) as its own record."""
        head = self._driver.session.heads.get(self._name)
        sink = self._spec.sink
        session = self._driver.session
        sink.recover(head, OutputContext(session.epoch, session.state_id, self._snapshots, session.check_not_fenced))
        if head is not None:  # no new snapshot until a batch after the newest stored one
            self._snapshot_of = max((o.snapshot.batch for o in head.outputs.values() if o.snapshot), default=-1)
        crash_point(IN_RECOVERY)
        written = sink.start(int(time.time() * 1000))
        if written is not None:
            self._commit(written, head, head.batch if head else -1, int(time.time() * 1000),
                         head.offsets if head else {}, kind="start")

    def committed_since(self, moment: float) -> bool:
        return self._last_commit > moment

    def caught_up(self) -> bool:
        head = self._driver.session.heads.get(self._name)
        return all(tracker.caught_up(head.offsets.get(pid) if head else None)
                   for pid, tracker in self._trackers.items())

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        try:
            with self._batch_lock:
                self._handle(df, batch_id)
                if self.codegen_after_first_batch:
                    first_batch.codegen_on(df)
                    self.codegen_after_first_batch = False
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
        # Before the output: a source that cannot read its part of the batch whole stops
        # the driver here, or says what it skips (counted with the commit).
        skipped = {pid: self._trackers[pid].unreadable(head.offsets.get(pid) if head else None, offset)
                   for pid, offset in offsets.items()}
        if self._spec.lookups:
            offsets.update(self._lookup_positions())
        session.check_not_fenced()
        try:
            written = self._spec.sink.write(Batch(batch_id, batch_time_ms, df))
        except BaseException:
            self._spec.sink.aborted()
            raise
        crash_point(AFTER_OUTPUT, batch_id)
        new_head = self._commit(written, head, batch_id, batch_time_ms, offsets, skipped=skipped)
        log.info("query %s: committed batch %d (%s)", self._name, batch_id,
                 ", ".join(f"{pid}: {self._describe(pid, o)}" for pid, o in offsets.items()))
        self._maybe_snapshot(new_head)

    def _commit(self, written: Written, head: QueryHead | None, batch_id: int, batch_time_ms: int,
                offsets: dict[str, Any], kind: str = "commit",
                skipped: Mapping[str, Mapping[str, int]] | None = None) -> QueryHead:
        new_head = QueryHead(
            batch=batch_id,
            batch_time_ms=batch_time_ms,
            commit_time_ms=int(time.time() * 1000),
            offsets=offsets,
            outputs={**(head.outputs if head else {}), **written.outputs},
            sources=self._counters(head, offsets, skipped or {}) if kind == "commit" else (head.sources if head else {}),
            iterate=written.iterate if written.iterate is not None else (head.iterate if head else None),
        )
        try:
            self._driver.commit(self._name, new_head, kind)
        except BaseException:
            self._spec.sink.aborted()
            raise
        if kind == "commit":
            crash_point(AFTER_COMMIT, batch_id)
        self._spec.sink.committed(written)
        self._last_commit = time.monotonic()
        if kind == "commit" and self._spec.tables:
            self._driver.tables_committed(self._name, new_head)
        return new_head

    def _describe(self, pid: str, offset: Any) -> str:
        tracker = self._trackers.get(pid)
        if tracker is not None:
            return tracker.describe(offset)
        position = LookupPosition.from_offset(offset)
        return f"looked up version {position.version}" if position else json.dumps(offset, sort_keys=True)[:200]

    def _lookup_positions(self) -> dict[str, Any]:
        """The version of each shared table this batch looked up, as its commit records it."""
        from spark_app.runtime.tables.lookup import versions_read

        uris = {pid: self._driver.table_uri(pid) for pid in self._spec.lookups}
        versions = versions_read(self._spark(), self._name, uris)
        return {pid: LookupPosition(version).to_offset() for pid, version in versions.items()}

    def _spark(self) -> Any:
        from pyspark.sql import SparkSession

        return SparkSession.builder.getOrCreate()

    def between_batches(self) -> None:
        """Called by the driver's supervision while the query may be idle: snapshots are
        committed and started as after a batch, so that a burst of input followed by quiet
        is covered by a snapshot too, not only by the changelog a restart replays."""
        if not self._batch_lock.acquire(blocking=False):
            return  # a batch is under way; it does this when it ends
        try:
            head = self._driver.session.heads.get(self._name)
            if head is not None:
                self._maybe_snapshot(head)
        finally:
            self._batch_lock.release()

    def snapshot_before_stop(self, timeout_s: float) -> None:
        """On a clean stop, once the query has stopped: stores and commits a snapshot of
        what was committed since the last one, so that the next driver (a planned restart:
        an upgrade, a changed spec) replays no changelog. Up to ``timeout_s``; a snapshot
        not stored by then is left (the changelog still covers it)."""
        with self._batch_lock:
            if self._name not in self._driver.session.heads:
                return
            for _ in range(2):  # one under way (of an older batch), then one of the last
                for output in self._spec.sink.outputs():
                    output.wait_for_snapshot(timeout_s)
                self._last_snapshot = float("-inf")
                self._maybe_snapshot(self._driver.session.heads[self._name])

    def _maybe_snapshot(self, head: QueryHead) -> None:
        """Commits the snapshots stored since the last call (in the background, see
        sinks.keyed_state.Snapshotter) with ``head``, the newest commit, then, once an
        interval has passed and there is a newer batch to cover, starts the next ones."""
        outputs = dict(head.outputs)
        finished = []
        for output in self._spec.sink.outputs():
            if output.name in outputs:
                stored = output.finished_snapshot(outputs[output.name])
                if stored is not None:
                    finished.append((output, outputs[output.name]))
                    outputs[output.name] = stored
        if finished:
            crash_point(AFTER_SNAPSHOT_WRITE, head.batch)
            head = replace(head, outputs=outputs)
            self._driver.commit(self._name, head, kind="snapshot")
            crash_point(AFTER_SNAPSHOT_COMMIT, head.batch)
            for output, previous in finished:  # only now is the previous snapshot no longer the one to load
                output.snapshot_committed(previous, self._snapshots)
        due = time.monotonic() - self._last_snapshot >= self._driver.snapshot_interval_s
        if not due or head.batch <= self._snapshot_of:
            return
        started = [output.start_snapshot(head.outputs[output.name], head.batch, self._snapshots)
                   for output in self._spec.sink.outputs() if output.name in head.outputs]
        if all(started):  # else one is still storing an older snapshot: this batch is tried again
            # Once per interval: not at every retry while an output's snapshot is still stored.
            self._driver.snapshot_state_stores(self._name)
            self._last_snapshot = time.monotonic()
            self._snapshot_of = head.batch

    def _read_offsets(self, batch_id: int) -> tuple[int, dict[str, Any]]:
        try:
            return read_planned(self._snapshots, self._name, self._spec.sources, batch_id)
        except NotFound:
            raise StateDamaged(f"Spark's offset log has no entry for batch {batch_id} of {self._name}") from None

    def _counters(self, head: QueryHead | None, offsets: dict[str, Any],
                  skipped: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
        counters = {pid: dict(v) for pid, v in (head.sources if head else {}).items()}
        for pid, offset in offsets.items():
            if pid not in self._trackers:
                continue  # a lookup's version: not a stream's position
            start = head.offsets.get(pid) if head else None
            previous = counters.get(pid, {})
            counters[pid] = self._trackers[pid].counters(previous, start, offset)
            for name, n in skipped.get(pid, {}).items():
                counters[pid][name] = previous.get(name, 0) + n
        return counters


def read_planned(snapshots: Storage, query: str, sources: Sequence[str], batch_id: int) -> tuple[int, dict[str, Any]]:
    """A planned batch's time and its sources' end offsets, from Spark's offset log: one
    line per source, in the order Spark numbers the query's sources (``sources``). Raises
    ``NotFound`` if the batch has no entry."""
    lines = snapshots.read(join("checkpoints", query, "offsets", str(batch_id))).decode().splitlines()
    metadata = json.loads(lines[1])
    return int(metadata.get("batchTimestampMs", 0)), offsets_by_source(query, sources, lines[2:])


def offsets_by_source(query: str, sources: Sequence[str], lines: Sequence[str]) -> dict[str, Any]:
    """Spark's offset lines (one per source of the query, "-" for one without an offset
    yet) named by persistent id. The offsets of spark_app's own sources name their source
    (a query may hold several relations of one source, e.g. an iterate's: each has a line
    of its own, all equal). A JVM source's offset (Kafka's, Delta's) names nothing: those
    lines, and the "-" lines among them, go by position to the query's sources that no line
    named (``sources`` is in Spark's order, pipeline.source_ids)."""
    named: dict[str, Any] = {}
    unnamed: list[str | None] = []
    for line in lines:
        if not line or line == "-":
            unnamed.append(None)
            continue
        offset = json.loads(line)
        source = offset.get("source") if isinstance(offset, dict) else None
        if isinstance(source, str):
            if source not in sources:
                raise StateDamaged(f"Spark's offset log of {query} has the offset of source {source!r}, which the "
                                   f"query does not read ({', '.join(sources)}): its checkpoint belongs to another "
                                   "query")
            named[source] = offset
        else:
            unnamed.append(line)
    others = [pid for pid in sources if pid not in named]
    offered = [line for line in unnamed if line is not None]
    if len(offered) > len(others):
        raise StateDamaged(f"Spark's offset log of {query} has {len(offered)} offsets of sources that do not name "
                           f"themselves, where the query has {len(others)} ({', '.join(others) or 'none'}): its "
                           "checkpoint belongs to another query")
    if len(unnamed) != len(others):
        # Some "-" lines are of named sources' other relations: their places say nothing.
        unnamed = list(offered)
    return {**named, **{pid: json.loads(line) for pid, line in zip(others, unnamed, strict=False) if line is not None}}


def check_checkpoints(snapshots: Storage, heads: dict[str, QueryHead]) -> None:
    for name, head in heads.items():
        if not _planned_batches(snapshots, name):
            raise StateDamaged(
                f"the metadata log says output {name!r} committed batch {head.batch}, but Spark's checkpoint "
                f"at {snapshots.spark_uri(join('checkpoints', name))} is gone; restore it, or reset the state"
            )


def clear_unplanned(snapshots: Storage, queries: Sequence[str]) -> None:
    """Spark starts a query whose offset log has no entry only in an empty checkpoint
    folder. On a volume it writes each entry to a hidden temporary file and renames it, so
    a driver killed or frozen in between leaves the file and no entry, and Spark refused
    every later start. A query without an entry has planned nothing: whatever its folder
    holds is such a leftover, and goes. (On S3 an entry appears whole or not at all.)
    ``queries``: those without a commit (one with a commit has entries: check_checkpoints)."""
    for name in queries:
        if _planned_batches(snapshots, name):
            continue
        left = [key for part in ("offsets", "commits", "state")
                for key in snapshots.list(join("checkpoints", name, part) + "/")]
        for key in left:
            snapshots.delete(key)
        if left:
            log.warning("removed what a driver left unfinished in Spark's checkpoint of %s, which has planned no "
                        "batch yet: %s", name, ", ".join(key.split("/", 2)[2] for key in left))


def _planned_batches(snapshots: Storage, query: str) -> list[str]:
    """The entries of the query's offset log (named by their batch, without temporary files)."""
    return [key for key in snapshots.list(join("checkpoints", query, "offsets") + "/")
            if key.rpartition("/")[2].isdigit()]


def settled_queries(snapshots: Storage, heads: Mapping[str, QueryHead]) -> set[str]:
    """The queries whose last committed batch Spark has committed too (its commit log has
    the batch), so that Spark plans the next one rather than replaying it."""
    settled = set()
    for name, head in heads.items():
        try:
            snapshots.read(join("checkpoints", name, "commits", str(head.batch)))
        except NotFound:
            continue
        settled.add(name)
    return settled


def planned_first_batches(snapshots: Storage, queries: Mapping[str, QuerySpec],
                          heads: Mapping[str, QueryHead]) -> dict[str, dict[str, Any]]:
    """Per streaming query that has committed no batch, the offsets of the first batch a
    killed driver planned in Spark's offset log (which Spark replays as planned), by
    persistent id; a query with no such plan is left out. Before its first commit a query
    has planned at most batch 0: Spark plans the next one only once a batch is done."""
    planned = {}
    for name, spec in queries.items():
        if spec.df is None or name in heads:
            continue
        try:
            planned[name] = read_planned(snapshots, name, spec.sources, 0)[1]
        except NotFound:
            continue
    return planned
