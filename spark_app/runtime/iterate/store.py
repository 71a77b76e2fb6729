"""Where an iterate operator keeps its tables: Delta tables in snapshot storage.

* ``iterate/<id>/contents/<table>``: for a streaming table, a snapshot of its contents:
  each row once, with its multiplicity in ``_diff``.
* ``iterate/<id>/inputs/<table>``: the log of the changes since that snapshot (the rows
  plus ``_diff``, netted per batch). The contents are the snapshot with the log folded in.
  A small batch is appended. A run that crashed after its append but before its commit
  leaves versions beyond the committed one: the first append of a store (one per query
  start) finds them and restores the committed version first, so a replayed batch is
  not appended twice. (Delta's own idempotent append, a transaction id per batch, costs
  a rebuild of the table's state on every append: 1 to 3 s here, against 0.4 s.) Once
  the log holds a quarter as many rows as the snapshot, the batch writes a new snapshot
  and empties the log instead: reading the contents back after a restart costs a scan of
  at most 1.25 times their size, not a regrouping of the table's whole history.
  A static table is stored whole, in the log, at each start.
* ``iterate/<id>/result/<table>``: the fixed point F, one Delta version per run.
* ``iterate/<id>/emitted/<table>``: what the outputs were last given (differs from F only
  for contractions, whose changes below the tolerance are not emitted).

The metadata log's commit names the Delta version of each of them, and readers read that
version: a run that crashes before its commit leaves versions nobody reads, so the
previous F stays intact.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from functools import reduce
from operator import and_
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from spark_app.storage import Storage, join

log = logging.getLogger("spark_app.iterate")

DIFF = "_diff"
# A new snapshot once the log holds 1/_SNAPSHOT_EVERY as many rows as the last one.
_SNAPSHOT_EVERY = 4
# Up to this many changed rows, folding them in scans the contents once instead of shuffling them.
_BROADCAST_ROWS = 200_000


class IterateStore:
    def __init__(self, spark: SparkSession, snapshots: Storage, persistent_id: str) -> None:
        self._spark = spark
        self._snapshots = snapshots
        self._base = join("iterate", persistent_id)
        self._persistent_id = persistent_id
        self._checked: set[str] = set()
        """Logs already appended to by this store; after their first append, every append of
        this store is followed by its commit, or the store is dropped (the query restarts)."""

    def _uri(self, kind: str, table: str) -> str:
        return self._snapshots.spark_uri(join(self._base, kind, table))

    def read_contents(self, table: str, log: int | None, snapshot: int | None, logged: int | None,
                      schema: StructType, materialize: bool) -> DataFrame:
        """The table's rows with their multiplicity (``_diff`` > 0): the ``snapshot`` version
        of its contents (None: none taken) with the ``log`` version of its changes folded in
        (None: nothing logged). ``logged`` is the log's length, if known. If ``materialize``,
        the result is computed now and kept in memory; otherwise it is a lazy read."""
        empty = self._spark.createDataFrame([], with_diff(schema))
        changes = empty if log is None else (
            self._spark.read.format("delta").option("versionAsOf", log).load(self._uri("inputs", table)))
        net = netted(changes)
        if snapshot is None:
            contents = net.where(F.col(DIFF) > 0)
        else:
            stored = self._spark.read.format("delta").option("versionAsOf", snapshot).load(self._uri("contents", table))
            rows = changes.count() if logged is None else logged
            contents = fold(stored, net, rows, empty=False, materialize=False) if rows else stored
        return contents.localCheckpoint(eager=True) if materialize else contents

    def store_changes(self, table: str, net: DataFrame, rows: int, contents: DataFrame,
                      stored: Mapping[str, Any]) -> dict[str, Any]:
        """Records a batch's netted changes (``rows`` of them) of a streaming table, whose contents are now
        ``contents``: appended to the log, or, once the log has grown to a quarter of the
        last snapshot, as a new snapshot with an empty log. ``stored`` and the result are
        {"log", "snapshot", "logged", "rows"}: the Delta versions of the log and the
        snapshot, the log's length in rows, and the snapshot's size. A batch without changes
        writes nothing."""
        logged = stored.get("logged", 0) + rows
        if "snapshot" in stored and rows == 0:
            return dict(stored)
        if "snapshot" in stored and logged * _SNAPSHOT_EVERY <= stored.get("rows", 0):
            return {**stored, "log": self.append_changes(table, net, stored["log"]), "logged": logged}
        snapshot = self.write("contents", table, contents)
        # Not counted from ``contents``: that may be a lazy plan (a stored snapshot with
        # changes folded in) that a second evaluation would recompute.
        rows = self.written_rows("contents", table, snapshot, contents.schema)
        return {"snapshot": snapshot, "rows": rows, "log": self.write("inputs", table, net.limit(0)), "logged": 0}

    def append_changes(self, table: str, changes: DataFrame, committed: int) -> int:
        """Appends ``changes`` (rows plus _diff) to the table's log, whose committed version
        is ``committed``; returns the log's version that includes them."""
        uri = self._uri("inputs", table)
        if table not in self._checked:
            latest = self._latest_version("inputs", table)
            if latest != committed:
                log.warning("iterate %s: the log of %s has versions %d to %d from a run that did not commit; "
                            "restoring version %d", self._persistent_id, table, committed + 1, latest, committed)
                from delta.tables import DeltaTable

                DeltaTable.forPath(self._spark, uri).restoreToVersion(committed)
            self._checked.add(table)
        changes.write.format("delta").mode("append").save(uri)
        return self._latest_version("inputs", table)

    def replace_contents(self, table: str, contents: DataFrame) -> int:
        """Stores a static table whole (each row once); returns the new version."""
        self.write("inputs", table, contents.withColumn(DIFF, F.lit(1)))
        return self._latest_version("inputs", table)

    def read(self, kind: str, table: str, version: int | None, schema: StructType) -> DataFrame:
        if version is None:
            return self._spark.createDataFrame([], schema)
        return self._spark.read.format("delta").option("versionAsOf", version).load(self._uri(kind, table))

    def write(self, kind: str, table: str, df: DataFrame) -> int:
        df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(self._uri(kind, table))
        return self._latest_version(kind, table)

    def _log(self, kind: str, table: str) -> str:
        """The storage key of a stored table's Delta log folder."""
        return join(self._base, kind, table, "_delta_log")

    def written_rows(self, kind: str, table: str, version: int, schema: StructType) -> int:
        """The number of rows a write put in ``version``: the ``numOutputRows`` that Delta
        records in the commit, read with the storage backend. Counting the version with
        Spark costs a read of the table (2.4 s for the first one in a driver); the count is
        the fallback when the commit has no metrics (spark.databricks.delta.history.metricsEnabled
        turned off)."""
        commit = self._snapshots.read(join(self._log(kind, table), f"{version:020d}.json"))
        for line in commit.decode().splitlines():
            info = json.loads(line).get("commitInfo")
            rows = (info or {}).get("operationMetrics", {}).get("numOutputRows")
            if rows is not None:
                return int(rows)
        return self.read(kind, table, version, schema).count()

    def _latest_version(self, kind: str, table: str) -> int:
        """The table's latest Delta version: the highest commit file in its ``_delta_log``.
        A listing, where asking Delta for its history costs a Spark job (0.2 to 0.4 s)."""
        log_folder = self._log(kind, table) + "/"
        names = (key.rsplit("/", 1)[-1] for key in self._snapshots.list(log_folder))
        versions = [int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit()]
        if not versions:
            raise FileNotFoundError(f"no Delta commit under {self._snapshots.spark_uri(log_folder)}")
        return max(versions)


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
