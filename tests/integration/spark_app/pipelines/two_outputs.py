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
parser.add_argument("--log-retained", type=int, default=100, help="compact the metadata log this often")
parser.add_argument("--index-compact-after", type=int, default=64, help="compact the file index this often")
parser.add_argument("--max-files-per-trigger", type=int, default=None)
parser.add_argument("--max-bytes-per-trigger", type=int, default=None)
parser.add_argument("--outage-budget-s", type=float, default=900.0)
parser.add_argument("--lease-ttl-s", type=float, default=30.0)
parser.add_argument("--format", choices=["csv", "jsonlines"], default="csv",
                    help="how the input files are read; changing it keeps the state")
parser.add_argument("--pattern", default="*")
args = parser.parse_args()

reader = sa.io.csv.read if args.format == "csv" else sa.io.jsonlines.read
words = reader(args.input, schema="word STRING, n INT", persistent_id="words", pattern=args.pattern,
               max_files_per_trigger=args.max_files_per_trigger, max_bytes_per_trigger=args.max_bytes_per_trigger)
counts = words.groupBy(args.group_by).agg(F.count("*").alias("count"), F.sum("n").alias("total"))
sa.io.jsonlines.write(counts, f"{args.out_dir}/counts.jsonlines")
sa.io.jsonlines.write(words.filter("n % 2 = 0"), f"{args.out_dir}/even.jsonlines")

backend = sa.persistence.Backend.from_uri(args.state, endpoint_url=args.endpoint_url)
sa.run(
    persistence_config=sa.persistence.Config.simple_config(
        backend, snapshot_interval_ms=args.snapshot_interval_ms, log_retained=args.log_retained,
        index_compact_after=args.index_compact_after, outage_budget_s=args.outage_budget_s,
        lease_ttl_s=args.lease_ttl_s,
    ),
    trigger_interval_ms=args.trigger_interval_ms,
    stop_when_idle=args.stop_when_idle,
)
