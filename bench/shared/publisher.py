"""bench-shared (b): the one pipeline that maintains the per-customer aggregate, published
as the shared table ``customers``."""

import argparse

from pyspark.sql import functions as F

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--orders", required=True)
parser.add_argument("--state", required=True)
parser.add_argument("--trigger-interval-ms", type=int, default=500)
parser.add_argument("--max-bytes-per-trigger", type=int)
args = parser.parse_args()

orders = sa.io.csv.read(args.orders, schema="order_id STRING, customer_id STRING, region STRING, amount LONG",
                        persistent_id="orders", max_bytes_per_trigger=args.max_bytes_per_trigger)
customers = (orders.groupBy("customer_id")
             .agg(F.max("region").alias("region"), F.count("*").alias("open_orders"), F.sum("amount").alias("total")))
sa.io.tables.publish(customers, name="customers", key=["customer_id"])
sa.run(persistence_config=sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(args.state)),
       trigger_interval_ms=args.trigger_interval_ms)
