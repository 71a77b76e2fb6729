"""A multi-source pipeline: ad impressions (CSV) and clicks (JSON lines) from two folders,
counted per ad into one table kept as a changelog and as a Delta table.

    python -m spark_app run examples/ad_stats.py --impressions imp/ --clicks clicks/ --state state/

Each source has its own persistent_id, so each resumes from its own offset.
"""

import argparse

from pyspark.sql import functions as F

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--impressions", default="impressions/")
parser.add_argument("--clicks", default="clicks/")
parser.add_argument("--output", default="ad_stats.jsonlines")
parser.add_argument("--delta", default=None, help="also keep the table as Delta at this path")
parser.add_argument("--state", default=None)
parser.add_argument("--stop-when-idle", action="store_true")
args = parser.parse_args()

impressions = sa.io.csv.read(args.impressions, schema="ad STRING, user STRING, ts TIMESTAMP",
                             persistent_id="impressions")
clicks = sa.io.jsonlines.read(args.clicks, schema="ad STRING, user STRING, ts TIMESTAMP",
                              persistent_id="clicks")

events = (impressions.select("ad", F.lit(1).alias("impression"), F.lit(0).alias("click"))
          .unionByName(clicks.select("ad", F.lit(0).alias("impression"), F.lit(1).alias("click"))))
stats = events.groupBy("ad").agg(F.sum("impression").alias("impressions"), F.sum("click").alias("clicks"))
sa.io.jsonlines.write(stats, args.output)
if args.delta:
    sa.io.delta.write(stats, args.delta)

config = None
if args.state:
    config = sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(args.state))
sa.run(persistence_config=config, stop_when_idle=args.stop_when_idle)
