"""A reader's stream of a shared table's changes: its contents as of a version (the
snapshot phase), then every later version's changes, each row with ``diff`` (+1 insert,
-1 retract; an update is -old +new).

It is Delta's streaming change data feed (``readChangeFeed``). Its offsets are Delta's
(table id, version, index in the version, whether still in the snapshot), in Spark's
offset log like any source's; the batch's commit records them under the input's
persistent id (spark_app.runtime.commit reads JVM sources' offsets by their position)
and the reader's hold follows them (spark_app.runtime.tables.readers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader

from spark_app.runtime.sources.base import Offset
from spark_app.state.delta_log import TableLog
from spark_app.state.tables import CHANGE_DIFFS, ChangelogPosition
from spark_app.storage import NotFound, Storage

PERSISTENT_ID_OPTION = "spark_app_persistent_id"
"""Names the input in the query's plan (spark_app.runtime.pipeline.source_ids); Delta ignores it."""
CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP = "_change_type", "_commit_version", "_commit_timestamp"
DIFF = "diff"
END_INDEX = 2**63 - 1 - 100
"""Delta's DeltaSourceOffset.END_INDEX: the offset's index once a version is wholly read."""


class SnapshotPhase(Protocol):
    """How a reader that has no position yet gets the table's contents before its changes."""

    def configure(self, reader: DataStreamReader) -> DataStreamReader: ...


class DeltaInitialSnapshot:
    """Delta's own: a change data feed stream started without ``startingVersion`` first
    returns the table as of the version it starts at, every row an insert, then the
    changes of each later version. (One batch reads at most ``maxFilesPerTrigger``
    files, so a large table arrives in several batches.)"""

    def configure(self, reader: DataStreamReader) -> DataStreamReader:
        return reader


class ChangelogSource:
    def __init__(self, spark: SparkSession, uri: str, persistent_id: str,
                 snapshot: SnapshotPhase | None = None, max_files_per_trigger: int | None = None,
                 with_version: bool = False) -> None:
        self._spark = spark
        self.uri = uri
        self.persistent_id = persistent_id
        self.snapshot = snapshot or DeltaInitialSnapshot()
        self._max_files = max_files_per_trigger
        self._with_version = with_version

    def stream(self) -> DataFrame:
        reader = (self._spark.readStream.format("delta").option("readChangeFeed", "true")
                  .option(PERSISTENT_ID_OPTION, self.persistent_id))
        if self._max_files:
            reader = reader.option("maxFilesPerTrigger", str(self._max_files))
        return as_changelog(self.snapshot.configure(reader).load(self.uri), self._with_version)


class ChangelogTracker:
    """A changelog input as its query's commit sees it (spark_app.runtime.sources.base.Tracker)."""

    def __init__(self, table: Storage) -> None:
        self._log = TableLog(table)

    def caught_up(self, committed: Offset | None) -> bool:
        """Caught up once no version after its committed position changed the table's
        data. Delta's offset after the last file of a version is that version at
        END_INDEX, or at the index of that file, or the next version at BASE_INDEX; it
        stays put through versions that change no data (the compaction's OPTIMIZE, an
        empty batch's MERGE), which the stream skips."""
        latest = self._log.latest()
        if latest is None:
            return True
        if committed is None:
            return False
        position = ChangelogPosition.from_offset(dict(committed))
        try:
            if position.index >= END_INDEX:
                unread = position.version + 1
            elif position.index < 0:  # nothing of that version read yet (Delta's BASE_INDEX, metadata indexes)
                unread = position.version
            elif position.snapshot:
                return False  # part way through the table's contents as of that version
            else:
                # Delta leaves the offset at the index of the last file it read when the version
                # is the latest (files are indexed from 0 in the order of the version's changes).
                done = position.index >= len(self._log.commit(position.version).change_files) - 1
                if not done:
                    return False
                unread = position.version + 1
            return not any(self._log.commit(v).change_files for v in range(unread, latest + 1))
        except NotFound:
            return False  # its commit is gone: the reader is behind the compaction, not caught up

    def unreadable(self, start: Offset | None, end: Offset) -> dict[str, int]:
        return {}  # its hold keeps the versions it reads; a broken hold raises HoldBroken (Readers), never skips

    def counters(self, previous: Mapping[str, int], start: Offset | None, end: Offset) -> dict[str, int]:
        """The version the reader has reached (nothing is set aside)."""
        return {"version": ChangelogPosition.from_offset(dict(end)).version}

    def describe(self, offset: Offset) -> str:
        position = ChangelogPosition.from_offset(dict(offset))
        return f"{'snapshot of ' if position.snapshot else ''}version {position.version}"


def diff_column() -> Column:
    """``_change_type`` as +1/-1 (CHANGE_DIFFS)."""
    cases = F.lit(None).cast("int")
    for change, diff in CHANGE_DIFFS.items():
        cases = F.when(F.col(CHANGE_TYPE) == change, F.lit(diff)).otherwise(cases)
    return cases


def as_changelog(raw: DataFrame, with_version: bool = False) -> DataFrame:
    """The table's columns and ``diff`` (and the version that made the change, as
    ``_commit_version``, if asked: it makes an update's two rows differ by more than
    their values, so keyed consumers should not take it)."""
    columns = [c for c in raw.columns if c not in (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)]
    extra = [F.col(COMMIT_VERSION)] if with_version else []
    return raw.select(*columns, diff_column().alias(DIFF), *extra)
