"""A test pipeline with a keyed output (counts per word) and an append-only one (even rows)."""

import argparse

from pyspark.sql import functions as F

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--input", required=True)
parser.add_argument("--out-dir", required=True)
parser.add_argument("--state", required=True)
parser.add_argument("--endpoint-url", default=None)
parser.add_argument("--snapshot-interval-ms", type=int, default=2000)
parser.add_argument("--trigger-interval-ms", type=int, default=200)
parser.add_argument("--stop-when-idle", action="store_true")
parser.add_argument("--group-by", default="word", help="changing it is an incompatible change")
args = parser.parse_args()

words = sa.io.csv.read(args.input, schema="word STRING, n INT", persistent_id="words")
counts = words.groupBy(args.group_by).agg(F.count("*").alias("count"), F.sum("n").alias("total"))
sa.io.jsonlines.write(counts, f"{args.out_dir}/counts.jsonlines")
sa.io.jsonlines.write(words.filter("n % 2 = 0"), f"{args.out_dir}/even.jsonlines")

backend = sa.persistence.Backend.from_uri(args.state, endpoint_url=args.endpoint_url)
sa.run(
    persistence_config=sa.persistence.Config.simple_config(
        backend, snapshot_interval_ms=args.snapshot_interval_ms
    ),
    trigger_interval_ms=args.trigger_interval_ms,
    stop_when_idle=args.stop_when_idle,
)
