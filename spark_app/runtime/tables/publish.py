"""The publisher's side of a shared table: a keyed Delta table under the pipeline's state,
``<state root>/tables/<name>``, on the state's own storage (a claim or S3).

Each batch is one MERGE (one table version) with Delta's transaction id set to this
table of this state (``txnAppId``) and the batch (``txnVersion``): a replayed batch, one
the last driver wrote but did not commit, is skipped by Delta itself, so a batch never
makes a second version. The version is found in the log by that transaction id and is
part of the batch's commit (``OutputHead.position``). The table records its key
(``spark_app.key``, for readers that backfill it in key order), keeps its change data
feed (readers read it as a changelog), keeps its log until compaction says otherwise
(``delta.enableExpiredLogCleanup`` is off: Delta's own cleanup is by age, and would take
versions a reader still holds) and has no deletion vectors (MERGE rewrites files, which
compaction then knows by name).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_app import contract
from spark_app.runtime.sinks.base import Batch, Output, OutputContext, OutputDamaged
from spark_app.runtime.sources.delta_table import table_metadata
from spark_app.runtime.tables.compaction import CompactionSettings, Compactor
from spark_app.runtime.tables.location import hadoop_uri
from spark_app.state.delta_log import TableLog
from spark_app.state.records import OutputHead
from spark_app.state.tables import HOLDS, KEY_PROPERTY, TABLES, HoldRegistry, encode_key
from spark_app.storage import ScopedStorage, join

log = logging.getLogger("spark_app")

DELETE_COLUMN = "__spark_app_delete"
TABLE_PROPERTIES = {
    "delta.enableChangeDataFeed": "true",
    "delta.enableExpiredLogCleanup": "false",
    "delta.enableDeletionVectors": "false",
    # Every checkpoint carries the `remove` of each file deleted within this duration (7
    # days by default): about four per batch, so the checkpoint grew with the history
    # (1,916 actions, 105 KB, after 500 batches). The compaction decides from the holds
    # which files go and never reads these tombstones; Delta's own VACUUM, which does,
    # must not be run on a shared table.
    "delta.deletedFileRetentionDuration": "interval 1 minutes",
}
TXN_CONF = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion")
# Delta takes a MERGE's transaction id from the session's configuration, which every query
# of the driver shares: one MERGE with a transaction id at a time.
TXN_LOCK = threading.Lock()


@dataclass(frozen=True)
class PublishOptions:
    delete_when: str | None = None
    """A SQL condition on the published rows: a row for which it holds deletes its key."""
    compaction: CompactionSettings = CompactionSettings()


class TableOutput(Output):
    """A published table: one current row per key, one version per committed batch."""

    def __init__(self, name: str, key: Sequence[str], schema: StructType, options: PublishOptions) -> None:
        super().__init__(name, "", key)
        self.schema = schema
        self.options = options
        self._app_id = ""
        self._rows = 0
        self._version: int | None = None
        self._lock = threading.Lock()
        """Held by each MERGE and by compaction's OPTIMIZE: the two would conflict."""
        self._compactor: Compactor | None = None
        self._log: TableLog | None = None

    @property
    def table_key(self) -> str:
        return join(TABLES, self.name)

    def recover(self, head: OutputHead | None, context: OutputContext) -> None:
        storage = ScopedStorage(context.snapshots, self.table_key)
        self.path = hadoop_uri(context.snapshots.spark_uri(self.table_key))
        self._app_id = f"spark_app-{context.state_id}-table-{self.name}"
        self._log = TableLog(storage)
        self._rows = head.rows if head else 0
        self._version = head.position if head else None
        spark = SparkSession.builder.getOrCreate()
        if not self._log.exists():
            if head is not None:
                raise OutputDamaged(f"table {self.name}: the state committed version {head.position} of "
                                    f"{self.path}, which is gone; restore it, or reset the pipeline's state")
            self._create(spark)
        else:
            self._record_key(spark)
        # A reader on the publisher's claim mounts this folder to write its hold: it must exist.
        storage.write(join(HOLDS, ".keep"), b"")
        if self._compactor is None:
            self._compactor = Compactor(self.name, self.path, storage, HoldRegistry(storage), self._lock,
                                        spark, self.options.compaction)
            self._compactor.start()

    def _create(self, spark: SparkSession) -> None:
        from delta.tables import DeltaTable

        builder = DeltaTable.createIfNotExists(spark).location(self.path).addColumns(self.schema)
        for name, value in {**TABLE_PROPERTIES, KEY_PROPERTY: encode_key(self.key or ())}.items():
            builder = builder.property(name, value)
        builder.execute()
        log.info("table %s: created at %s (key %s)", self.name, self.path, ", ".join(self.key or ()))

    def _record_key(self, spark: SparkSession) -> None:
        """Records the key in a table created before keys were recorded (or published since
        with another key): one version that changes no data, which changelogs skip."""
        key = encode_key(self.key or ())
        if table_metadata(spark, self.path)[1].get(KEY_PROPERTY) == key:
            return
        quoted = key.replace("\\", "\\\\").replace("'", "\\'")
        with self._lock:
            spark.sql(f"ALTER TABLE delta.`{self.path}` SET TBLPROPERTIES ('{KEY_PROPERTY}' = '{quoted}')")
        log.info("table %s: recorded its key (%s) in its properties", self.name, ", ".join(self.key or ()))

    def write(self, batch: Batch) -> OutputHead:
        from delta.tables import DeltaTable

        assert self._log is not None and self.key is not None
        source = batch.df
        if self.options.delete_when:
            source = source.withColumn(DELETE_COLUMN, F.coalesce(F.expr(self.options.delete_when), F.lit(False)))
        spark = source.sparkSession
        version = self._log.txn_version(self._app_id, batch.batch_id)
        if version is not None:
            # A replay of a batch the table already has (killed after the MERGE, before the
            # commit). Delta would skip the MERGE without running its source, and Spark then
            # refuses to move on: the stateful operators' new state version is committed only
            # when the batch's plan runs (STATE_STORE_COMMIT_VALIDATION_FAILED). So it runs.
            log.info("table %s: batch %d is already version %d; replaying it without a write",
                     self.name, batch.batch_id, version)
            batch.df.write.format("noop").mode("overwrite").save()
        else:
            with self._lock, TXN_LOCK:
                spark.conf.set(TXN_CONF[0], self._app_id)
                spark.conf.set(TXN_CONF[1], str(batch.batch_id))
                try:
                    _merge(DeltaTable.forPath(spark, self.path), source, self.key, self.schema.fieldNames(),
                           bool(self.options.delete_when))
                finally:
                    for name in TXN_CONF:
                        spark.conf.unset(name)
            version = self._log.txn_version(self._app_id, batch.batch_id)
        if version is None:
            raise OutputDamaged(f"table {self.name}: batch {batch.batch_id} was merged, but no version of "
                                f"{self.path} carries it (the table was replaced outside spark_app?)")
        metrics = self._log.commit(version).metrics
        rows = self._rows + metrics.get("numTargetRowsInserted", 0) - metrics.get("numTargetRowsDeleted", 0)
        return OutputHead(position=version, rows=rows)

    def committed(self, head: OutputHead) -> None:
        self._rows, self._version = head.rows, head.position
        if self._compactor is not None:
            self._compactor.batch_committed()

    def table_report(self) -> contract.TableReport:
        report = self._compactor.report() if self._compactor else contract.TableReport()
        # The table's latest version: the last batch's, or a compaction's OPTIMIZE after it
        # (the frontier and the holds may stand in that one; a version below them reads as nonsense).
        known = [v for v in (self._version, report.version) if v is not None]
        return contract.TableReport(version=max(known) if known else None, rows=self._rows, bytes=report.bytes,
                                    frontier=report.frontier, compacted_ms=report.compacted_ms,
                                    holders=report.holders)

    def close(self) -> None:
        if self._compactor is not None:
            self._compactor.stop()
            self._compactor = None


def _merge(target: object, source: DataFrame, key: Sequence[str], columns: list[str], deletes: bool) -> None:
    """Upserts the batch's rows by key; with ``deletes``, a row marked for deletion removes its key."""
    condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in key)
    assignments = {f"`{c}`": f"s.`{c}`" for c in columns}
    keep = f"NOT s.`{DELETE_COLUMN}`" if deletes else None
    merge = target.alias("t").merge(source.alias("s"), condition)  # type: ignore[attr-defined]
    if deletes:
        merge = merge.whenMatchedDelete(condition=f"s.`{DELETE_COLUMN}`")
    (merge.whenMatchedUpdate(condition=keep, set=assignments)
     .whenNotMatchedInsert(condition=keep, values=assignments).execute())
