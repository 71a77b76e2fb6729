"""The baseline: the same word count written directly in Structured Streaming, with a
checkpoint, the RocksDB state store and changelog checkpointing, writing its update-mode
output as JSON lines through foreachBatch. No spark_app anywhere."""

import argparse
import json
import os

from pyspark.sql import SparkSession

parser = argparse.ArgumentParser()
parser.add_argument("--input", required=True)
parser.add_argument("--output", required=True)
parser.add_argument("--checkpoint", required=True)
args = parser.parse_args()

builder = SparkSession.builder.appName("baseline")
for key, value in json.loads(os.environ.get("SPARK_APP_SPARK_CONF", "{}")).items():
    builder = builder.config(key, value)
spark = (builder
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.streaming.stateStore.providerClass",
                 "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
         .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
         .getOrCreate())
spark.sparkContext.setLogLevel("WARN")

words = spark.readStream.schema("word STRING").option("header", "true").csv(args.input)
counts = words.groupBy("word").count()


def append(batch, batch_id):  # type: ignore[no-untyped-def]
    rows = batch.toArrow().to_pylist()
    with open(args.output, "a") as handle:
        handle.writelines(json.dumps({**row, "batch": batch_id}) + "\n" for row in rows)


query = (counts.writeStream.outputMode("update").foreachBatch(append)
         .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start())
query.awaitTermination()
