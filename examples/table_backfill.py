"""Reads a keyed Delta table that keeps changing as a changelog (README: backfill): its
rows in key order a chunk at a time, rate-limited, while the changes to the keys already
read flow; then only the changes. It keeps, per id, whether the row is live and its
value, so the output, folded, is the table.

The table needs its change data feed (``delta.enableChangeDataFeed = true``) and the
columns ``id`` and ``value``. Under the operator, ``spec.inputs`` with persistentId
``accounts`` sets the backfill's rate while the driver runs:

    inputs:
      - persistentId: accounts
        backfill: {rowsPerSecond: 5000}   # 0 pauses it; null is unlimited
"""

import argparse

from pyspark.sql import functions as F

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--table", required=True, help="the Delta table (a path or s3a:// URI)")
parser.add_argument("--output", required=True)
parser.add_argument("--chunk-rows", type=int, default=100_000)
parser.add_argument("--rows-per-second", type=float, default=None, help="until the resource says otherwise")
parser.add_argument("--trigger-interval-ms", type=int, default=1000)
args = parser.parse_args()

accounts = sa.io.delta.read(args.table, key=["id"], persistent_id="accounts", chunk_rows=args.chunk_rows,
                            rows_per_second=args.rows_per_second)
per_id = accounts.groupBy("id").agg(F.sum("diff").alias("n"), F.sum(F.col("value") * F.col("diff")).alias("value"))
sa.io.jsonlines.write(per_id, args.output)
sa.run(trigger_interval_ms=args.trigger_interval_ms)
