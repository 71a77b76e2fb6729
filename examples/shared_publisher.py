"""The publisher of a shared table: orders aggregated per customer, maintained once and
read by other pipelines (examples/shared_tiers.py reads its changes,
examples/shared_clicks.py looks it up).

    python -m spark_app run examples/shared_publisher.py --orders orders/ --state state/publisher

Each order line is ``order_id,customer_id,region,amount,kind`` with ``kind`` order or
cancel (a cancel carries the cancelled amount, negated). A customer whose orders are all
cancelled is deleted from the table. The table is ``customers``, at
``<state>/tables/customers``; under the operator, the PersistentPipeline lists it in
``spec.tables`` (with the namespaces that may read it) and readers name it
``<this pipeline>/customers`` in their ``spec.inputs``.
"""

import argparse

from pyspark.sql import functions as F

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--orders", default="orders/")
parser.add_argument("--state", default=None, help="a state folder or s3://bucket/prefix (default: injected)")
parser.add_argument("--endpoint-url", default=None)
parser.add_argument("--max-hold-age-s", type=float, default=None)
parser.add_argument("--compact-every-batches", type=int, default=10)
parser.add_argument("--compact-every-s", type=float, default=60.0)
parser.add_argument("--compaction-margin-s", type=float, default=60.0)
parser.add_argument("--max-files-per-trigger", type=int, default=None)
parser.add_argument("--trigger-interval-ms", type=int, default=1000)
parser.add_argument("--stop-when-idle", action="store_true")
args = parser.parse_args()

orders = sa.io.csv.read(args.orders, schema="order_id STRING, customer_id STRING, region STRING, amount LONG, "
                                            "kind STRING", persistent_id="orders",
                        max_files_per_trigger=args.max_files_per_trigger)
customers = (orders
             .select("customer_id", "region", "amount",
                     F.when(F.col("kind") == "cancel", -1).otherwise(1).alias("n"))
             .groupBy("customer_id")
             .agg(F.max("region").alias("region"), F.sum("n").alias("open_orders"), F.sum("amount").alias("total")))
sa.io.tables.publish(customers, name="customers", key=["customer_id"], delete_when="open_orders = 0",
                     max_hold_age_s=args.max_hold_age_s, compact_every_batches=args.compact_every_batches,
                     compact_every_s=args.compact_every_s, compaction_margin_s=args.compaction_margin_s)

config = None
if args.state:
    config = sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(args.state,
                                                                                 endpoint_url=args.endpoint_url))
sa.run(persistence_config=config, trigger_interval_ms=args.trigger_interval_ms, stop_when_idle=args.stop_when_idle)
