"""Where an iterate operator keeps its tables: Delta tables in snapshot storage.

Every table is written to a location of its own, ``iterate/<id>/<kind>/<table>/e<epoch>-<n>``,
and the metadata log's commit names the location and Delta version of each table the
committed state consists of (a ``TableRef``). Readers read exactly those (as the Parquet
files that version's commits add, where that is all the version is: see ``read``). So:

* a run that crashes before its commit leaves tables nobody reads, and the previous
  state stays intact;
* a driver that was superseded but still runs (frozen, partitioned) writes only to
  locations of its own epoch, which the newer driver neither reads nor appends to;
* superseded locations are deleted whole once a commit no longer names them, and a new
  driver deletes what no commit names (crashed runs, superseded drivers): storage holds
  the committed state, not its history, and no Delta vacuum is needed.

The kinds:

* ``contents/<table>``: for a streaming table, a snapshot of its contents: each row once,
  with its multiplicity in ``_diff``.
* ``inputs/<table>``: the log of the changes since that snapshot (the rows plus ``_diff``,
  netted per batch), as a list of segments: a driver appends to a segment it created, and
  starts a new one after a restart or after an append that did not commit. The contents
  are the snapshot with every segment folded in. Once the log holds a quarter as many
  rows as the snapshot, the batch writes a new snapshot and an empty log instead:
  reading the contents back after a restart costs a scan of at most 1.25 times their
  size, not a regrouping of the table's whole history. A static table is stored whole
  here, at each start.
* ``result/<table>``: the fixed point F.
* ``emitted/<table>``: what the outputs were last given (differs from F only for
  contractions, whose changes below the tolerance are not emitted).

Commits made before locations existed name a Delta version of ``<kind>/<table>`` (a
plain number); they are read as before, and replaced by the first new commit.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import reduce
from operator import and_
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from spark_app.state.delta_log import TableLog
from spark_app.storage import ScopedStorage, Storage, join

log = logging.getLogger("spark_app.iterate")

DIFF = "_diff"
# A new snapshot once the log holds 1/_SNAPSHOT_EVERY as many rows as the last one.
_SNAPSHOT_EVERY = 4
# Up to this many changed rows, folding them in scans the contents once instead of shuffling them.
_BROADCAST_ROWS = 200_000
_LOCATION = re.compile(r"^e\d{6}-[0-9a-f]{8}$")
# A stored version whose log has more commits than this is read by Delta, from its checkpoint.
_PLAIN_READ_COMMITS = 32
_GLOB = "*?[]{}\\"


@dataclass(frozen=True)
class TableRef:
    """One committed version of one stored table."""

    at: str
    """The table's location, relative to the iterate's folder (``<kind>/<table>/<name>``)."""
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "version": self.version}

    @classmethod
    def from_json(cls, value: Any, kind: str, table: str) -> TableRef | None:
        if value is None:
            return None
        if isinstance(value, int):  # written before locations: the table's one fixed place
            return cls(f"{kind}/{table}", value)
        return cls(str(value["at"]), int(value["version"]))


def log_refs(value: Any, table: str) -> list[TableRef]:
    """The segments of a table's log, as a commit names them."""
    if value is None:
        return []
    if not isinstance(value, list):  # one table: a log before locations, or a static table's contents
        return [ref for ref in [TableRef.from_json(value, "inputs", table)] if ref is not None]
    return [ref for item in value if (ref := TableRef.from_json(item, "inputs", table)) is not None]


def locations(versions: Mapping[str, Any]) -> set[str]:
    """Every location a commit's ``versions`` name."""
    refs: list[TableRef | None] = []
    for kind, tables in versions.items():
        for table, value in tables.items():
            if kind == "contents":  # a streaming table's snapshot (its log is under "inputs")
                refs.append(TableRef.from_json(value.get("snapshot"), kind, table))
            elif kind == "inputs" and isinstance(value, list):  # a streaming table's log
                refs += log_refs(value, table)
            else:  # a static table's contents, F, what was emitted (or a log before locations)
                refs.append(TableRef.from_json(value, kind, table))
    return {ref.at for ref in refs if ref is not None}


class IterateStore:
    def __init__(self, spark: SparkSession, snapshots: Storage, persistent_id: str, epoch: int) -> None:
        self._spark = spark
        self._snapshots = snapshots
        self._base = join("iterate", persistent_id)
        self._persistent_id = persistent_id
        self._epoch = epoch
        self._appended: dict[str, int] = {}
        """Log segments this store created, with the version its last append made."""
        self._logs: dict[str, TableLog] = {}
        """The Delta logs of the tables read, each commit read once."""

    def _uri(self, at: str) -> str:
        return self._snapshots.spark_uri(join(self._base, at))

    def _new_location(self, kind: str, table: str) -> str:
        return f"{kind}/{table}/e{self._epoch:06d}-{uuid.uuid4().hex[:8]}"

    def read_contents(self, table: str, snapshot: TableRef | None, log: list[TableRef], logged: int | None,
                      schema: StructType, materialize: bool) -> DataFrame:
        """The table's rows with their multiplicity (``_diff`` > 0): the ``snapshot`` (None:
        none taken) with every segment of its ``log`` folded in. ``logged`` is the log's
        length, if known. If ``materialize``, the result is computed now and kept in
        memory; otherwise it is a lazy read."""
        empty = self._spark.createDataFrame([], with_diff(schema))
        changes = reduce(DataFrame.unionByName, (self.read(ref, schema) for ref in log), empty)
        net = netted(changes)
        if snapshot is None:
            contents = net.where(F.col(DIFF) > 0)
        else:
            stored = self.read(snapshot, schema)
            rows = changes.count() if logged is None else logged
            contents = fold(stored, net, rows, empty=False, materialize=False) if rows else stored
        return contents.localCheckpoint(eager=True) if materialize else contents

    def store_changes(self, table: str, net: DataFrame, rows: int, contents: DataFrame,
                      stored: Mapping[str, Any]) -> dict[str, Any]:
        """Records a batch's netted changes (``rows`` of them) of a streaming table, whose
        contents are now ``contents``: appended to the log, or, once the log has grown to
        a quarter of the last snapshot, as a new snapshot with an empty log. ``stored`` and
        the result are {"snapshot", "rows", "log", "logged"}: the snapshot's ref and size
        in rows, the log's segments and its length in rows. A batch without changes
        writes nothing."""
        logged = stored.get("logged", 0) + rows
        if "snapshot" in stored and rows == 0:
            return dict(stored)
        if "snapshot" in stored and logged * _SNAPSHOT_EVERY <= stored.get("rows", 0):
            log_ = self.append_changes(table, net, log_refs(stored.get("log"), table))
            return {**stored, "log": [ref.to_json() for ref in log_], "logged": logged}
        snapshot = self.write("contents", table, contents)
        # Not counted from ``contents``: that may be a lazy plan (a stored snapshot with
        # changes folded in) that a second evaluation would recompute.
        return {"snapshot": snapshot.to_json(), "rows": self.written_rows(snapshot, contents.schema),
                "log": [], "logged": 0}

    def append_changes(self, table: str, changes: DataFrame, log: list[TableRef]) -> list[TableRef]:
        """Appends ``changes`` (rows plus _diff) to the table's committed ``log``; returns
        the log that includes them. Appends go to a segment of this store's own whose
        last append was committed; otherwise (after a restart, or an append whose commit
        failed) to a new segment, so that nothing uncommitted is ever read."""
        last = log[-1] if log else None
        if last is not None and self._appended.get(last.at) == last.version:
            changes.write.format("delta").mode("append").save(self._uri(last.at))
            self._appended[last.at] = last.version + 1
            return [*log[:-1], TableRef(last.at, last.version + 1)]
        at = self._new_location("inputs", table)
        changes.write.format("delta").save(self._uri(at))
        self._appended[at] = 0
        return [*log, TableRef(at, 0)]

    def replace_contents(self, table: str, contents: DataFrame) -> TableRef:
        """Stores a static table whole (each row once)."""
        return self.write("inputs", table, contents.withColumn(DIFF, F.lit(1)))

    def read(self, ref: TableRef | None, schema: StructType) -> DataFrame:
        if ref is None:
            return self._spark.createDataFrame([], schema)
        files = self._parquet_files(ref)
        if files is None:
            return self._spark.read.format("delta").option("versionAsOf", ref.version).load(self._uri(ref.at))
        stored_schema, uris = files
        if not uris:
            return self._spark.createDataFrame([], stored_schema)
        return self._spark.read.schema(stored_schema).parquet(*uris)

    def _parquet_files(self, ref: TableRef) -> tuple[StructType, list[str]] | None:
        """The schema and files of a stored version, for reading them as plain Parquet.

        Every table here is written by this store and read at a version its commit names,
        so its files are known from its own few commits. Delta would first build the
        table's snapshot with Spark jobs: about 1 s for each table a driver reads, against
        0.2 s for reading its files (a tiny table, in a warm driver); each batch reads a
        table or two, a restart all of them. A long log (Delta has checkpoints for it),
        a commit gone, or a feature beyond plain Parquet is read by Delta."""
        if ref.version >= _PLAIN_READ_COMMITS:
            return None
        found = self._log(ref.at).files_at(ref.version)
        if found is None:
            return None
        uris = [self._uri(join(ref.at, name)) for name in sorted(found[1])]
        if any(c in uri for uri in uris for c in _GLOB):  # Spark would take the path for a pattern
            return None
        return StructType.fromJson(json.loads(found[0])), uris

    def _log(self, at: str) -> TableLog:
        """The Delta log of the table at ``at``, whose commits are read once per driver."""
        found = self._logs.get(at)
        if found is None:
            found = self._logs[at] = TableLog(ScopedStorage(self._snapshots, join(self._base, at)))
        return found

    def write(self, kind: str, table: str, df: DataFrame) -> TableRef:
        """Writes ``df`` as a new table (version 0) at a location of its own."""
        at = self._new_location(kind, table)
        df.write.format("delta").save(self._uri(at))
        return TableRef(at, 0)

    def written_rows(self, ref: TableRef, schema: StructType) -> int:
        """The number of rows a write put in ``ref``'s version: the ``numOutputRows`` that
        Delta records in the commit, read with the storage backend. Counting the version
        with Spark costs a read of the table (2.4 s for the first one in a driver); the
        count is the fallback when the commit has no metrics
        (spark.databricks.delta.history.metricsEnabled turned off)."""
        rows = self._log(ref.at).commit(ref.version).metrics.get("numOutputRows")
        return rows if rows is not None else self.read(ref, schema).count()

    def drop(self, superseded: Iterable[str]) -> None:
        """Deletes locations that the committed state no longer names."""
        for at in superseded:
            self._delete_location(at)
            self._appended.pop(at, None)
            self._logs.pop(at, None)

    def collect_garbage(self, keep: set[str]) -> int:
        """Deletes every location of this driver's epoch or an older one that ``keep`` (the
        committed state it resumed) does not name: what crashed runs and superseded
        drivers wrote. Never a newer epoch's: a superseded driver that gets here late must
        not delete what the newer one wrote. Returns how many went."""
        found = {self._location_of(key) for key in self._snapshots.list(self._base + "/")}
        doomed = sorted(at for at in found if at and at not in keep and _epoch_of(at) <= self._epoch)
        for at in doomed:
            self._delete_location(at)
        if doomed:
            log.info("iterate %s: deleted %d stored tables that no commit names", self._persistent_id, len(doomed))
        return len(doomed)

    def _location_of(self, key: str) -> str | None:
        parts = key[len(self._base) + 1:].split("/")
        if len(parts) < 3:
            return None
        return "/".join(parts[:3]) if _LOCATION.match(parts[2]) else "/".join(parts[:2])

    def _delete_location(self, at: str) -> None:
        prefix = join(self._base, at) + "/"
        if len(at.split("/")) == 3:
            self._snapshots.delete_prefix(prefix)
            return
        for key in self._snapshots.list(prefix):  # a table of the fixed place: not the locations inside it
            rest = key[len(prefix):].split("/")
            if not (len(rest) > 1 and _LOCATION.match(rest[0])):
                self._snapshots.delete(key)


def _epoch_of(at: str) -> int:
    """The epoch that wrote a location (0 for the fixed places of before locations)."""
    name = at.split("/")[-1]
    return int(name[1:7]) if _LOCATION.match(name) else 0


def with_diff(schema: StructType) -> StructType:
    return StructType([*schema.fields, StructField(DIFF, IntegerType(), False)])


def netted(changes: DataFrame, diff: str = DIFF) -> DataFrame:
    """Changes (rows plus a ``diff`` column) summed per row; rows whose changes cancel out go."""
    columns = [c for c in changes.columns if c != diff]
    return changes.groupBy(*columns).agg(F.sum(diff).cast("int").alias(diff)).where(F.col(diff) != 0)


def fold(contents: DataFrame, net: DataFrame, rows: int, empty: bool, materialize: bool) -> DataFrame:
    """Applies netted changes to contents, both with multiplicities in ``_diff`` (a row
    deleted once of two insertions stays); the result is materialized if ``materialize``.

    Only the contents' rows that the changes touch are regrouped: with few changes, these
    are found with a broadcast of the changed rows, so the contents are scanned but not
    shuffled."""
    columns = [c for c in contents.columns if c != DIFF]
    net = net.select(*columns, F.col(DIFF).cast("int").alias(DIFF))
    if empty:
        folded = net.where(F.col(DIFF) > 0)
    else:
        if rows <= _BROADCAST_ROWS:
            keys = F.broadcast(net.select(*columns)).alias("k")
            stored = contents.alias("c")
            same = reduce(and_, [F.col(f"c.`{c}`").eqNullSafe(F.col(f"k.`{c}`")) for c in columns])
            untouched = stored.join(keys, same, "left_anti")
            touched = stored.join(keys, same, "left_semi").unionByName(net)
        else:
            untouched, touched = contents.limit(0), contents.unionByName(net)
        regrouped = touched.groupBy(*columns).agg(F.sum(DIFF).cast("int").alias(DIFF)).where(F.col(DIFF) > 0)
        folded = untouched.unionByName(regrouped)
    return folded.localCheckpoint(eager=True) if materialize else folded
