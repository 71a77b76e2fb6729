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
import time
from collections.abc import Mapping
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
from spark_app.persistence import Backend
from spark_app.runtime.kafka_clients import Admin, PartitionOffsets, parse_offsets
from spark_app.runtime.pipeline import QuerySpec
from spark_app.runtime.sinks.base import Batch, OutputContext, Written
from spark_app.runtime.sources.dead_letters import count_dead_letters, kafka_origins
from spark_app.runtime.sources.files import SourceOrderChanged
from spark_app.runtime.sources.kafka import KafkaSourceSpec, data_lost, gaps
from spark_app.state.file_index import FileIndex
from spark_app.state.records import QueryHead
from spark_app.state.session import StateSession
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

    @property
    def index_compact_after(self) -> int: ...

    def commit(self, name: str, head: QueryHead, kind: str = "commit") -> None: ...

    def record_fatal(self, error: BaseException) -> None: ...


class BatchHandler:
    """Spark's foreachBatch callback for one query: the per-batch commit protocol."""

    def __init__(self, name: str, spec: QuerySpec, driver: Committer, snapshots: Storage,
                 dead_letter: Backend, kafka: Mapping[str, KafkaSourceSpec]) -> None:
        self._name = name
        self._spec = spec
        self._driver = driver
        self._snapshots = snapshots
        self._dead_letter = dead_letter
        self._kafka = {pid: kafka[pid] for pid in spec.sources if pid in kafka}
        self._indexes = {pid: FileIndex(snapshots, pid, driver.index_compact_after)
                         for pid in spec.sources if pid not in self._kafka}
        self._admins = {pid: Admin(source.connection) for pid, source in self._kafka.items()}
        self._last_commit = 0.0
        self._last_snapshot = time.monotonic()
        self.checkpoint_uri = snapshots.spark_uri(join("checkpoints", name))

    def recover(self) -> None:
        """Aligns the sink with the last commit, then commits the sink's start-up work (an
        iterate operator checking its stored fixed point) as its own record."""
        head = self._driver.session.heads.get(self._name)
        sink = self._spec.sink
        session = self._driver.session
        sink.recover(head, OutputContext(session.epoch, session.state_id, self._snapshots, session.check_not_fenced))
        crash_point(IN_RECOVERY)
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
        for pid, source in self._kafka.items():
            committed = parse_offsets(head.offsets.get(pid, {})) if head else {}
            if not committed:
                return False
            # Partitions added since the last batch count too (with a pattern, those of the
            # topics read so far; Spark's own check covers new topics).
            topics = source.topics or sorted({tp.topic for tp in committed})
            latest = self._admins[pid].latest(self._admins[pid].partitions(topics))
            if any(offset > committed.get(tp, 0) for tp, offset in latest.items()):
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
        lost = self._kafka_gaps(batch_id, offsets)
        session.check_not_fenced()
        try:
            written = self._spec.sink.write(Batch(batch_id, batch_time_ms, df))
        except BaseException:
            self._spec.sink.aborted()
            raise
        crash_point(AFTER_OUTPUT, batch_id)
        new_head = self._commit(written, head, batch_id, batch_time_ms, offsets, lost=lost)
        log.info("query %s: committed batch %d (%s)", self._name, batch_id,
                 ", ".join(f"{pid}: {_describe(o)}" for pid, o in offsets.items()))
        self._maybe_snapshot(new_head)

    def _commit(self, written: Written, head: QueryHead | None, batch_id: int, batch_time_ms: int,
                offsets: dict[str, Any], kind: str = "commit", lost: Mapping[str, int] | None = None) -> QueryHead:
        new_head = QueryHead(
            batch=batch_id,
            batch_time_ms=batch_time_ms,
            commit_time_ms=int(time.time() * 1000),
            offsets=offsets,
            outputs={**(head.outputs if head else {}), **written.outputs},
            sources=self._counters(head, offsets, lost or {}) if kind == "commit" else (head.sources if head else {}),
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
        return new_head

    def _maybe_snapshot(self, head: QueryHead) -> None:
        if time.monotonic() - self._last_snapshot < self._driver.snapshot_interval_s:
            return
        self._last_snapshot = time.monotonic()
        outputs = dict(head.outputs)
        snapshotted = []
        for output in self._spec.sink.outputs():
            if output.name in outputs:
                stored = output.snapshot(outputs[output.name], head.batch, self._snapshots)
                if stored is not None:
                    snapshotted.append((output, outputs[output.name]))
                    outputs[output.name] = stored
        if not snapshotted:
            return
        crash_point(AFTER_SNAPSHOT_WRITE, head.batch)
        self._driver.commit(self._name, replace(head, outputs=outputs), kind="snapshot")
        crash_point(AFTER_SNAPSHOT_COMMIT, head.batch)
        for output, previous in snapshotted:  # only now is the previous snapshot no longer the one to load
            output.snapshot_committed(previous, self._snapshots)

    def _read_offsets(self, batch_id: int) -> tuple[int, dict[str, Any]]:
        """Spark's offset log entry of a batch: its time, and each source's end offset under
        its persistent id. Lines are mapped to sources by position (a Kafka offset names no
        source); a file source's offset names its own, which must agree."""
        lines = self._offset_log(batch_id)
        if lines is None:
            raise StateDamaged(f"Spark's offset log has no entry for batch {batch_id} of {self._name}")
        metadata = json.loads(lines[1])
        entries = lines[2:]
        order = self._spec.offset_order
        if len(entries) != len(order):
            raise SourceOrderChanged(
                f"Spark's offset log of {self._name} holds {len(entries)} sources for batch {batch_id}, but the "
                f"query reads {len(order)} ({', '.join(order)}): its sources changed since its state was written")
        offsets = {}
        for pid, line in zip(order, entries, strict=True):
            if not line or line == "-":
                continue
            offset = json.loads(line)
            named = offset.get("source") if pid not in self._kafka else None
            if pid not in self._kafka and named != pid:
                raise SourceOrderChanged(
                    f"source {pid!r} of {self._name} was given the offset of source {named!r}: the query's "
                    "sources were reordered or replaced since its state was written")
            offsets[pid] = offset
        return int(metadata.get("batchTimestampMs", 0)), offsets

    def _offset_log(self, batch_id: int) -> list[str] | None:
        try:
            return self._snapshots.read(join("checkpoints", self._name, "offsets", str(batch_id))).decode().splitlines()
        except NotFound:
            return None

    def _kafka_gaps(self, batch_id: int, offsets: dict[str, Any]) -> dict[str, int]:
        """Offsets of this batch's Kafka partitions that retention removed before they were
        read, per source (raises KafkaDataLost where the source may not skip them). The
        batch starts where the previous one ended: Spark's previous offset log entry (or,
        for the query's first batch, the initial offsets Spark chose)."""
        lost: dict[str, int] = {}
        for pid, source in self._kafka.items():
            if pid not in offsets:
                continue
            end = parse_offsets(offsets[pid])
            start = self._kafka_start(batch_id, pid)
            found = gaps(start, end, self._admins[pid].earliest(end))
            if found and source.fail_on_data_loss:
                raise data_lost(pid, found[0])
            for gap in found:
                log.warning("source %s: offsets %d to %d of %s were gone before they were read; skipped",
                            pid, gap.start, gap.first - 1, gap.partition)
            lost[pid] = sum(gap.size for gap in found)
        return lost

    def _kafka_start(self, batch_id: int, pid: str) -> PartitionOffsets:
        if batch_id > 0:
            previous = self._offset_log(batch_id - 1)
            if previous is not None:
                for line_pid, line in zip(self._spec.offset_order, previous[2:], strict=False):
                    if line_pid == pid and line and line != "-":
                        return parse_offsets(line)
        position = self._spec.offset_order.index(pid)
        try:  # what Spark chose at the query's first start: "v1\n{offsets}" (KafkaSourceInitialOffsetWriter)
            initial = self._snapshots.read(join("checkpoints", self._name, "sources", str(position), "0")).decode()
        except NotFound:
            return {}
        return parse_offsets(initial[initial.index("{"):])

    def _counters(self, head: QueryHead | None, offsets: dict[str, Any],
                  lost: Mapping[str, int]) -> dict[str, dict[str, int]]:
        counters = {pid: dict(v) for pid, v in (head.sources if head else {}).items()}
        for pid, offset in offsets.items():
            previous = counters.get(pid, {})
            if pid in self._kafka:
                start = parse_offsets(head.offsets.get(pid, {})) if head else {}
                end = parse_offsets(offset)
                origins = [o for tp, until in end.items() for o in
                           kafka_origins(self._dead_letter, pid, tp.topic, tp.partition, start.get(tp, 0), until)]
                set_aside = count_dead_letters(self._dead_letter, pid, origins)
                counters[pid] = {
                    "offsets": previous.get("offsets", 0) + sum(end[tp] - start.get(tp, 0) for tp in end),
                    "malformed": previous.get("malformed", 0) + set_aside.rows,
                    "lost": previous.get("lost", 0) + lost.get(pid, 0),
                }
                continue
            start_files = int(head.offsets.get(pid, {}).get("files", 0)) if head else 0
            end_files = int(offset["files"])
            files = self._indexes[pid].files(start_files, end_files) if end_files > start_files else []
            set_aside = count_dead_letters(self._dead_letter, pid, [f.path for f in files])
            counters[pid] = {
                "files": end_files,
                "malformed": previous.get("malformed", 0) + set_aside.rows,
                "file_problems": previous.get("file_problems", 0) + set_aside.files,
            }
        return counters


def _describe(offset: dict[str, Any]) -> str:
    if "files" in offset and "source" in offset:
        return f"{offset['files']} files"
    return json.dumps(offset, separators=(",", ":"), sort_keys=True)


def check_checkpoints(snapshots: Storage, heads: dict[str, QueryHead]) -> None:
    for name, head in heads.items():
        if not snapshots.list(join("checkpoints", name, "offsets") + "/"):
            raise StateDamaged(
                f"the metadata log says output {name!r} committed batch {head.batch}, but Spark's checkpoint "
                f"at {snapshots.spark_uri(join('checkpoints', name))} is gone; restore it, or reset the state"
            )
