"""The baseline: the same word count over a Kafka topic written directly in Structured
Streaming, with a checkpoint, the RocksDB state store and changelog checkpointing, parsing
the JSON values with from_json and writing its update-mode output as JSON lines through
foreachBatch. No spark_app anywhere. Runs until SIGTERM.

With --parse python the values are parsed in a Python stage (mapInArrow, json.loads)
instead of the JVM's from_json, as spark_app's Kafka source parsed JSON until 2026-11-28
(and parses CSV still): the benchmark runs this variant too, to tell what such a stage
costs."""

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import baseline_session  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--bootstrap-servers", required=True)
parser.add_argument("--topic", required=True)
parser.add_argument("--output", required=True)
parser.add_argument("--checkpoint", required=True)
parser.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
parser.add_argument("--trigger-interval-ms", type=int, default=100)
parser.add_argument("--parse", choices=("jvm", "python"), default="jvm")
args = parser.parse_args()

spark = baseline_session("baseline")

messages = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap_servers)
            .option("subscribe", args.topic).option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
            .option("kafka.isolation.level", "read_committed").load())


def parse_in_python(batches):  # type: ignore[no-untyped-def]
    import pyarrow as pa

    for batch in batches:
        words = [json.loads(value)["word"] for value in batch.column("value").to_pylist()]
        yield pa.RecordBatch.from_arrays([pa.array(words, pa.string())], names=["word"])


if args.parse == "python":
    words = messages.select("value").mapInArrow(parse_in_python, "word STRING")
else:
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
