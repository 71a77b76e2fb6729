"""A reader that looks a shared table up (examples/shared_publisher.py publishes it):
each click enriched with its customer's region, from the table's latest version at the
start of each batch, without keeping a copy of the table.

    python -m spark_app run examples/shared_clicks.py --clicks clicks/ --publisher-state state/publisher \\
        --output clicks.jsonlines --state state/clicks

Each click line is ``click_id,customer_id,page``. A click of a customer the table does
not hold gets a null region.
"""

import argparse

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--table", default="orders-enriched/customers")
parser.add_argument("--publisher-state", default=None, help="the publisher's state root (local runs)")
parser.add_argument("--clicks", default="clicks/")
parser.add_argument("--output", default="clicks.jsonlines")
parser.add_argument("--state", default=None, help="a state folder or s3://bucket/prefix (default: injected)")
parser.add_argument("--endpoint-url", default=None)
parser.add_argument("--trigger-interval-ms", type=int, default=1000)
parser.add_argument("--stop-when-idle", action="store_true")
args = parser.parse_args()

clicks = sa.io.csv.read(args.clicks, schema="click_id STRING, customer_id STRING, page STRING", persistent_id="clicks")
customers = sa.io.tables.lookup(args.table, persistent_id="customers_now", location=args.publisher_state)
enriched = clicks.join(customers.select("customer_id", "region"), "customer_id", "left")
sa.io.jsonlines.write(enriched, args.output)

config = None
if args.state:
    config = sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(args.state,
                                                                                 endpoint_url=args.endpoint_url))
sa.run(persistence_config=config, trigger_interval_ms=args.trigger_interval_ms, stop_when_idle=args.stop_when_idle)
