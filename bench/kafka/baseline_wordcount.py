"""The baseline: the same word count over a Kafka topic written directly in Structured
Streaming, with a checkpoint, the RocksDB state store and changelog checkpointing, parsing
the JSON values with from_json and writing its update-mode output as JSON lines through
foreachBatch. No spark_app anywhere. Runs until SIGTERM."""

import argparse
import json
import os
import signal
import threading

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

parser = argparse.ArgumentParser()
parser.add_argument("--bootstrap-servers", required=True)
parser.add_argument("--topic", required=True)
parser.add_argument("--output", required=True)
parser.add_argument("--checkpoint", required=True)
parser.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
parser.add_argument("--trigger-interval-ms", type=int, default=100)
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

messages = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap_servers)
            .option("subscribe", args.topic).option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
            .option("kafka.isolation.level", "read_committed").load())
words = messages.select(F.from_json(F.col("value").cast("string"), "word STRING").alias("m")).select("m.word")
counts = words.groupBy("word").count()


def append(batch, batch_id):  # type: ignore[no-untyped-def]
    rows = batch.toArrow().to_pylist()
    with open(args.output, "a") as handle:
        handle.writelines(json.dumps({**row, "batch": batch_id}) + "\n" for row in rows)
        handle.flush()


query = (counts.writeStream.outputMode("update").foreachBatch(append)
         .option("checkpointLocation", args.checkpoint)
         .trigger(processingTime=f"{args.trigger_interval_ms} milliseconds").start())
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
while not stop.wait(0.2) and query.isActive:
    pass
query.stop()
