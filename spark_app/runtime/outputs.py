"""Outputs: where a query's batches go, written so that every batch lands exactly once.

Each output takes part in the batch commit in three steps. ``write`` makes the batch's
output durable but does not publish its position; the driver then appends the commit
record with that position to the metadata log; ``committed`` finally releases what was
held for the batch. After a crash, ``recover`` starts from the committed position:
lines written beyond it (a batch that did not commit) are cut off, and Spark's replay of
that batch writes them again.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame

from spark_app.runtime.output_state import OutputState
from spark_app.state.records import OutputHead, OutputSnapshot, QueryHead
from spark_app.storage import NotFound, Storage, join

log = logging.getLogger("spark_app")

RESERVED_COLUMNS = ("time", "diff")


@dataclass(frozen=True)
class Batch:
    """One micro-batch as an output sees it."""

    batch_id: int
    time_ms: int
    """The batch's logical time: Spark's batch timestamp, the same when the batch is replayed."""
    df: DataFrame
    changelog: bool = False
    """The rows already carry their ``diff`` (an upstream operator computed the changes)."""


@dataclass(frozen=True)
class Written:
    """What a batch wrote, to be committed: the outputs' new heads and, for an iterate
    operator, its new stored state."""

    outputs: dict[str, OutputHead]
    iterate: dict[str, Any] | None = None


class OutputDamaged(Exception):
    """An output no longer matches its committed position (edited or deleted by hand)."""


class Output(ABC):
    def __init__(self, name: str, path: str, key: Sequence[str] | None) -> None:
        self.name = name
        self.path = path
        self.key = tuple(key) if key is not None else None

    @abstractmethod
    def recover(self, head: OutputHead | None, snapshots: Storage) -> None:
        """Aligns the output with its last committed head (None: nothing committed yet)."""

    @abstractmethod
    def write(self, batch: Batch) -> OutputHead:
        """Writes the batch durably and returns the head to commit; publishes nothing."""

    def committed(self, head: OutputHead) -> None:
        """The commit record holding ``head`` is durable."""

    def aborted(self) -> None:
        """The batch will not be committed by this driver."""

    def snapshot(self, head: OutputHead, batch_id: int, snapshots: Storage) -> OutputHead | None:
        """Stores a snapshot of the output's state, if it has any; returns the new head."""
        return None

    def close(self) -> None:
        pass


class Sink(ABC):
    """What a query writes its batches to: one output, or an operator that feeds several
    (see spark_app.runtime.iterate). The driver commits what ``write`` returns."""

    @abstractmethod
    def outputs(self) -> list[Output]:
        """The outputs whose heads this sink's commits carry."""

    @abstractmethod
    def recover(self, head: QueryHead | None, snapshots: Storage) -> None:
        """Aligns with the query's last committed head (None: nothing committed yet)."""

    @abstractmethod
    def write(self, batch: Batch) -> Written:
        """Writes a batch durably; publishes nothing until ``committed``."""

    def start(self, batch_time_ms: int) -> Written | None:
        """Work to commit before the first batch, if any (an iterate operator's check of
        its stored fixed point after a restart)."""
        return None

    def committed(self, written: Written) -> None:
        for output in self.outputs():
            if output.name in written.outputs:
                output.committed(written.outputs[output.name])

    def aborted(self) -> None:
        for output in self.outputs():
            output.aborted()

    def close(self) -> None:
        for output in self.outputs():
            output.close()


class SingleSink(Sink):
    """A query that feeds one output directly."""

    def __init__(self, output: Output) -> None:
        self.output = output

    def outputs(self) -> list[Output]:
        return [self.output]

    def recover(self, head: QueryHead | None, snapshots: Storage) -> None:
        self.output.recover(head.outputs.get(self.output.name) if head else None, snapshots)

    def write(self, batch: Batch) -> Written:
        return Written({self.output.name: self.output.write(batch)})


class JsonLinesOutput(Output):
    """A changelog of the query's result in one JSON-lines file: each row's columns plus
    ``time`` and ``diff``. In update mode an updated key gives a -1 line for the row last
    emitted and a +1 line for the new one; a row that did not change gives nothing."""

    def __init__(self, name: str, path: str, key: Sequence[str] | None) -> None:
        super().__init__(name, os.path.abspath(path), key)
        self._state = OutputState(self.key) if self.key is not None else None
        self._head = OutputHead(position=0, rows=0)

    def recover(self, head: OutputHead | None, snapshots: Storage) -> None:
        self._head = head or OutputHead(position=0, rows=0)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        size = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        if size < self._head.position:
            raise OutputDamaged(
                f"output {self.path} holds {size} bytes but {self._head.position} were committed: it was "
                "truncated or replaced outside spark_app; restore it, or reset the pipeline's state"
            )
        if size > self._head.position:
            verb = "overwriting" if head is None else "cutting off"
            log.info("output %s: %s %d bytes written after the last commit", self.path, verb,
                     size - self._head.position)
        with open(self.path, "ab") as handle:
            handle.truncate(self._head.position)
            os.fsync(handle.fileno())
        if self._state is not None:
            self._rebuild_state(snapshots)

    def _rebuild_state(self, snapshots: Storage) -> None:
        assert self._state is not None
        start = 0
        snap = self._head.snapshot
        if snap is not None:
            try:
                self._state.restore(snapshots.read(snap.key))
                start = snap.position
            except NotFound:
                log.warning("output %s: snapshot %s is missing; replaying the whole changelog", self.name, snap.key)
        replayed = self._state.apply_changelog(_lines(self.path, start, self._head.position))
        log.info("output %s: state of %d keys restored (snapshot at byte %d, %d changelog lines replayed)",
                 self.name, len(self._state), start, replayed)

    def write(self, batch: Batch) -> OutputHead:
        rows = [_jsonable(row) for row in batch.df.toArrow().to_pylist()]
        if batch.changelog:
            # Retractions first, so that within a batch a row is removed before its update lands.
            lines = sorted(([({k: v for k, v in row.items() if k != "diff"}, int(row["diff"])) for row in rows]),
                           key=lambda line: line[1])
        elif self._state is not None:
            lines = self._changes(rows)
        else:
            lines = [(row, 1) for row in rows]
        encoded = b"".join(
            json.dumps({**row, "time": batch.time_ms, "diff": diff}, separators=(",", ":"), default=str).encode()
            + b"\n"
            for row, diff in lines
        )
        try:
            with open(self.path, "r+b") as handle:
                handle.truncate(self._head.position)
                handle.seek(self._head.position)
                handle.write(encoded)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            self.aborted()
            raise
        return OutputHead(self._head.position + len(encoded), self._head.rows + len(lines), self._head.snapshot)

    def _changes(self, rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
        assert self._state is not None
        keyed = {self._state.key_of(row): row for row in rows}  # the last update of a key wins
        self._state.begin()
        old = self._state.lookup(keyed)
        changes: list[tuple[dict[str, Any], int]] = []
        updates = []
        for key, row in keyed.items():
            encoded = _canonical(row)
            previous = old.get(key)
            if previous == encoded:
                continue
            if previous is not None:
                changes.append((json.loads(previous), -1))
            changes.append((row, 1))
            updates.append((key, encoded))
        self._state.upsert(updates)
        return changes

    def committed(self, head: OutputHead) -> None:
        self._head = head
        if self._state is not None:
            self._state.commit()

    def aborted(self) -> None:
        if self._state is not None:
            self._state.rollback()

    def snapshot(self, head: OutputHead, batch_id: int, snapshots: Storage) -> OutputHead | None:
        if self._state is None:
            return None
        key = join("outputs", self.name, "snapshots", f"{batch_id:012d}.sqlite")
        snapshots.write(key, self._state.snapshot())
        previous = head.snapshot
        self._head = OutputHead(head.position, head.rows, OutputSnapshot(batch_id, head.position, key))
        if previous is not None and previous.key != key:
            snapshots.delete(previous.key)
        return self._head

    def close(self) -> None:
        if self._state is not None:
            self._state.close()


class DeltaOutput(Output):
    """The query's result as a Delta table: appended rows, or in update mode the current
    row of every key (MERGE). Writes are idempotent through Delta's transaction ids
    (txnAppId = this output in this state, txnVersion = the batch id), so a replayed
    batch is skipped by Delta itself."""

    def __init__(self, name: str, path: str, key: Sequence[str] | None, app_id: str = "",
                 change_data_feed: bool = True) -> None:
        super().__init__(name, path, key)
        self._app_id = app_id
        self._change_data_feed = change_data_feed
        self._rows = 0

    def bind(self, app_id: str) -> None:
        self._app_id = app_id

    def recover(self, head: OutputHead | None, snapshots: Storage) -> None:
        self._rows = head.rows if head else 0

    def write(self, batch: Batch) -> OutputHead:
        from delta.tables import DeltaTable

        spark = batch.df.sparkSession
        count = batch.df.count()
        if self.key is None or not DeltaTable.isDeltaTable(spark, self.path):
            writer = (batch.df.write.format("delta").mode("append")
                      .option("txnAppId", self._app_id).option("txnVersion", batch.batch_id))
            if self._change_data_feed:
                writer = writer.option("delta.enableChangeDataFeed", "true")
            writer.save(self.path)
        else:
            spark.conf.set("spark.databricks.delta.write.txnAppId", self._app_id)
            spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch.batch_id))
            try:
                condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self.key)
                (DeltaTable.forPath(spark, self.path).alias("t").merge(batch.df.alias("s"), condition)
                 .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
            finally:
                spark.conf.unset("spark.databricks.delta.write.txnAppId")
                spark.conf.unset("spark.databricks.delta.write.txnVersion")
        version = DeltaTable.forPath(spark, self.path).history(1).collect()[0]["version"]
        return OutputHead(position=int(version), rows=self._rows + count)

    def committed(self, head: OutputHead) -> None:
        self._rows = head.rows


def _lines(path: str, start: int, end: int) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        handle.seek(start)
        remaining = end - start
        for line in handle:
            if remaining <= 0:
                break
            remaining -= len(line)
            yield line


def _canonical(row: dict[str, Any]) -> str:
    # Column order is fixed by the query's schema, so it is kept: retractions then read
    # like the rows they retract.
    return json.dumps(row, separators=(",", ":"), default=str)


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: _json_value(v) for k, v in row.items()}


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value
