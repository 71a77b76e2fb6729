"""A reader of a shared table's changes (examples/shared_publisher.py publishes it):
customers and revenue per spend tier, kept by consuming inserts, updates and deletes
(an update moves a customer from one tier to another: -1 from the old, +1 to the new).

    python -m spark_app run examples/shared_tiers.py --publisher-state state/publisher \\
        --output tiers.jsonlines --state state/tiers

``--changes`` also writes the table's changelog as it arrives (folding it gives the
table). ``--backfill`` reads the table's contents in key order, ``--chunk-rows`` at a
time, while its changes flow (``--rows-per-second`` limits it). Under the operator, --publisher-state is omitted: the PersistentPipeline's
``spec.inputs`` names the table and the operator says where it is.
"""

import argparse

from pyspark.sql import functions as F

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--table", default="orders-enriched/customers")
parser.add_argument("--publisher-state", default=None, help="the publisher's state root (local runs)")
parser.add_argument("--output", default="tiers.jsonlines")
parser.add_argument("--changes", default=None, help="also write the table's changelog here")
parser.add_argument("--state", default=None, help="a state folder or s3://bucket/prefix (default: injected)")
parser.add_argument("--endpoint-url", default=None)
parser.add_argument("--max-files-per-trigger", type=int, default=None)
parser.add_argument("--backfill", action="store_true", help="read the table's contents in key order, a chunk at a time")
parser.add_argument("--chunk-rows", type=int, default=None)
parser.add_argument("--rows-per-second", type=float, default=None)
parser.add_argument("--trigger-interval-ms", type=int, default=1000)
parser.add_argument("--stop-when-idle", action="store_true")
args = parser.parse_args()

changes = sa.io.tables.read(args.table, persistent_id="customers", location=args.publisher_state,
                            max_files_per_trigger=args.max_files_per_trigger, backfill=args.backfill,
                            chunk_rows=args.chunk_rows, rows_per_second=args.rows_per_second)
tier = (F.when(F.col("total") >= 10_000, "gold").when(F.col("total") >= 2_000, "silver").otherwise("bronze"))
tiers = (changes.withColumn("tier", tier)
         .groupBy("tier")
         .agg(F.sum("diff").alias("customers"), F.sum(F.col("total") * F.col("diff")).alias("revenue")))
sa.io.jsonlines.write(tiers, args.output)
if args.changes:
    sa.io.jsonlines.write(changes, args.changes)

config = None
if args.state:
    config = sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(args.state,
                                                                                 endpoint_url=args.endpoint_url))
sa.run(persistence_config=config, trigger_interval_ms=args.trigger_interval_ms, stop_when_idle=args.stop_when_idle)
