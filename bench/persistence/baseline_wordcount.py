"""The baseline: the same word count written directly in Structured Streaming, with a
checkpoint, the RocksDB state store and changelog checkpointing, writing its update-mode
output as JSON lines through foreachBatch. No spark_app anywhere. It runs until the input
is processed (``--stop-when-idle``), or on a trigger interval until it is stopped."""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import DataFrame  # noqa: E402

from bench.common import baseline_session  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--input", required=True)
parser.add_argument("--output", required=True)
parser.add_argument("--checkpoint", required=True)
parser.add_argument("--trigger-interval-ms", type=int, default=200)
parser.add_argument("--stop-when-idle", action="store_true")
args = parser.parse_args()

spark = baseline_session("baseline")

words = spark.readStream.schema("word STRING").option("header", "true").csv(args.input)
counts = words.groupBy("word").count()


def append(batch: DataFrame, batch_id: int) -> None:
    rows = batch.toArrow().to_pylist()
    with open(args.output, "a") as handle:
        handle.writelines(json.dumps({**row, "batch": batch_id}) + "\n" for row in rows)


writer = counts.writeStream.outputMode("update").foreachBatch(append).option("checkpointLocation", args.checkpoint)
if args.stop_when_idle:
    writer = writer.trigger(availableNow=True)
else:
    writer = writer.trigger(processingTime=f"{args.trigger_interval_ms} milliseconds")
writer.start().awaitTermination()
