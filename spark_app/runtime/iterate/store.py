"""Where an iterate operator keeps its tables: Delta tables in snapshot storage.

* ``iterate/<id>/inputs/<table>``: for a streaming table, an append-only log of its
  changes (the rows plus ``_diff``); its contents are the rows whose diffs sum to more
  than zero. Each batch appends with Delta's transaction id (``txnVersion`` = the Spark
  batch id), so a batch replayed after a crash, whose changes are the same, is not
  appended twice. A static table is stored whole at each start.
* ``iterate/<id>/result/<table>``: the fixed point F, one Delta version per run.
* ``iterate/<id>/emitted/<table>``: what the outputs were last given (differs from F only
  for contractions, whose changes below the tolerance are not emitted).

The metadata log's commit names the Delta version of each of them, and readers read that
version: a run that crashes before its commit leaves versions nobody reads, so the
previous F stays intact.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from spark_app.storage import Storage, join

DIFF = "_diff"


class IterateStore:
    def __init__(self, spark: SparkSession, snapshots: Storage, persistent_id: str) -> None:
        self._spark = spark
        self._snapshots = snapshots
        self._base = join("iterate", persistent_id)
        self._persistent_id = persistent_id

    def _uri(self, kind: str, table: str) -> str:
        return self._snapshots.spark_uri(join(self._base, kind, table))

    def read_contents(self, table: str, version: int | None, schema: StructType) -> DataFrame:
        """The table's rows with their multiplicity (``_diff`` > 0) as of the log's ``version``
        (None: nothing logged yet)."""
        if version is None:
            return self._spark.createDataFrame([], with_diff(schema))
        log = self._spark.read.format("delta").option("versionAsOf", version).load(self._uri("inputs", table))
        columns = [f.name for f in schema.fields]
        return (log.groupBy(*columns).agg(F.sum(DIFF).cast("int").alias(DIFF))
                .where(F.col(DIFF) > 0))

    def append_changes(self, table: str, changes: DataFrame, batch_id: int) -> int:
        """Appends ``changes`` (rows plus _diff) to the table's log once for ``batch_id``;
        returns the log's version that includes them."""
        (changes.write.format("delta").mode("append")
         .option("txnAppId", f"spark_app-iterate-{self._persistent_id}-{table}").option("txnVersion", batch_id)
         .save(self._uri("inputs", table)))
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

    def _latest_version(self, kind: str, table: str) -> int:
        from delta.tables import DeltaTable

        history = DeltaTable.forPath(self._spark, self._uri(kind, table)).history(1)
        return int(history.select("version").first()[0])  # type: ignore[index]


def with_diff(schema: StructType) -> StructType:
    return StructType([*schema.fields, StructField(DIFF, IntegerType(), False)])
