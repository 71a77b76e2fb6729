"""The benchmark's reader: a spark_app pipeline that backfills the upstream table and
writes out the markers (rows whose value is at least MARKER_BASE) as they arrive."""

import argparse

from pyspark.sql import functions as F

import spark_app as sa

MARKER_BASE = 10**15

parser = argparse.ArgumentParser()
parser.add_argument("--table", required=True)
parser.add_argument("--out-dir", required=True)
parser.add_argument("--state", required=True)
parser.add_argument("--chunk-rows", type=int, default=100_000)
parser.add_argument("--rows-per-second", type=float, default=None)
args = parser.parse_args()

rows = sa.io.delta.read(args.table, key=["id"], persistent_id="upstream", chunk_rows=args.chunk_rows,
                        rows_per_second=args.rows_per_second)
markers = rows.where((F.col("diff") == 1) & (F.col("value") >= MARKER_BASE)).select("id", "value")
sa.io.jsonlines.write(markers, f"{args.out_dir}/markers.jsonlines")
sa.run(persistence_config=sa.persistence.Config.simple_config(sa.persistence.Backend.filesystem(args.state)),
       trigger_interval_ms=200)
