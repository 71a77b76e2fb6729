"""A test pipeline that reads a keyed Delta table (id, value) as a changelog, backfilled in
key order, and keeps per id the number of live rows and their value: folded, the output is
the table (n = 1 and its value for a live id, n = 0 for a deleted one)."""

import argparse

from pyspark.sql import functions as F

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--input", required=True, help="the Delta table")
parser.add_argument("--out-dir", required=True)
parser.add_argument("--state", required=True)
parser.add_argument("--endpoint-url", default=None)
parser.add_argument("--chunk-rows", type=int, default=500)
parser.add_argument("--rows-per-second", type=float, default=None)
parser.add_argument("--trigger-interval-ms", type=int, default=200)
parser.add_argument("--stop-when-idle", action="store_true")
args = parser.parse_args()

rows = sa.io.delta.read(args.input, key=["id"], persistent_id="accounts", chunk_rows=args.chunk_rows,
                        rows_per_second=args.rows_per_second)
per_id = rows.groupBy("id").agg(F.sum("diff").alias("n"), F.sum(F.col("value") * F.col("diff")).alias("value"))
sa.io.jsonlines.write(per_id, f"{args.out_dir}/accounts.jsonlines")

backend = sa.persistence.Backend.from_uri(args.state, endpoint_url=args.endpoint_url)
sa.run(
    persistence_config=sa.persistence.Config.simple_config(backend, snapshot_interval_ms=2000),
    trigger_interval_ms=args.trigger_interval_ms,
    stop_when_idle=args.stop_when_idle,
)
