"""The pipeline `make bench-resume` stops and starts again: a grouped count over
high-cardinality keys (state: one row per key in Spark's state store and in the keyed
output's state), or a deduplication with a watermark (state: every id seen, in Spark's
state store only; its output is append-only)."""

import argparse

from pyspark.sql import functions as F

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--kind", choices=["count", "dedup"], default="count")
parser.add_argument("--input", required=True)
parser.add_argument("--output", required=True)
parser.add_argument("--state", required=True)
parser.add_argument("--endpoint-url", default=None)
parser.add_argument("--snapshot-interval-ms", type=int, default=10_000)
parser.add_argument("--trigger-interval-ms", type=int, default=200)
parser.add_argument("--max-files-per-trigger", type=int, default=None)
parser.add_argument("--stop-when-idle", action="store_true")
args = parser.parse_args()

if args.kind == "count":
    rows = sa.io.csv.read(args.input, schema="key STRING", persistent_id="keys",
                          max_files_per_trigger=args.max_files_per_trigger)
    sa.io.jsonlines.write(rows.groupBy("key").count(), args.output)
else:
    rows = sa.io.csv.read(args.input, schema="id STRING, at TIMESTAMP", persistent_id="events",
                          max_files_per_trigger=args.max_files_per_trigger)
    # Every id of the run stays in the state: the events span an hour, the delay is a day.
    unique = rows.withWatermark("at", "1 day").dropDuplicatesWithinWatermark(["id"])
    sa.io.jsonlines.write(unique.select("id", F.col("at").cast("string").alias("at")), args.output)

sa.run(
    persistence_config=sa.persistence.Config.simple_config(
        sa.persistence.Backend.from_uri(args.state, endpoint_url=args.endpoint_url),
        snapshot_interval_ms=args.snapshot_interval_ms),
    trigger_interval_ms=args.trigger_interval_ms,
    stop_when_idle=args.stop_when_idle,
)
