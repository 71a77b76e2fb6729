"""A Delta Lake table output."""

from __future__ import annotations

from collections.abc import Sequence

from spark_app.runtime.sinks.base import Batch, Output, OutputContext
from spark_app.state.records import OutputHead


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

    def recover(self, head: OutputHead | None, context: OutputContext) -> None:
        self._app_id = self._app_id or f"spark_app-{context.state_id}-{self.name}"
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
