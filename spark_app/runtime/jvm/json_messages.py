"""A Kafka source's JSON values parsed in the JVM (tools/jars/java/dev/sparkapp/sources:
JsonMessages, RejectedMessages).

Spark's JSON reader reads each message in the task that fetched it, so no row crosses to
a Python worker (that crossing made a word count's batch latency 1.23x plain Structured
Streaming's). The messages it does not keep travel to the driver with the tasks' results,
in an accumulator; ``drain`` hands them over, and the source's commit writes their dead
letters with the reason (spark_app.runtime.sources.kafka.PendingLetters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from spark_app.runtime.sources.kafka import RejectedMessage


def parse_in_jvm(raw: DataFrame, schema: StructType, columns: Sequence[str],
                 persistent_id: str) -> tuple[DataFrame, Callable[[], list[RejectedMessage]]]:
    """The records of Spark's Kafka rows ``raw`` read as ``schema``, with ``columns`` of
    the Kafka rows after them; and what hands the driver the messages set aside since."""
    spark = raw.sparkSession
    jvm = spark.sparkContext._jvm
    messages = jvm.dev.sparkapp.sources.JsonMessages  # type: ignore[union-attr]
    rejected = messages.rejected(spark.sparkContext._jsc.sc(),
                                 f"spark_app: messages of {persistent_id} set aside")
    jschema = jvm.org.apache.spark.sql.types.DataType.fromJson(schema.json())  # type: ignore[union-attr]
    df = DataFrame(messages.parse(raw._jdf, jschema, list(columns), rejected), spark)

    def drain() -> list[RejectedMessage]:
        return [RejectedMessage(m.topic(), m.partition(), m.offset(),
                                None if m.value() is None else bytes(m.value()), m.length())
                for m in rejected.drain()]

    return df, drain
