"""Word count over a folder of CSV files, persistent: the seed example of Pathway's guide.

    python -m spark_app run examples/wordcount.py --input inputs/ --output result.jsonlines --state state/

Under the operator, --state is omitted: the persistence configuration comes from the
environment the operator injects (spark_app.persistence.Config.from_env).
"""

import argparse

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--input", default="inputs/")
parser.add_argument("--output", default="result.jsonlines")
parser.add_argument("--state", default=None, help="a state folder or s3://bucket/prefix (default: injected)")
parser.add_argument("--snapshot-interval-ms", type=int, default=10_000)
parser.add_argument("--trigger-interval-ms", type=int, default=1000)
parser.add_argument("--stop-when-idle", action="store_true")
args = parser.parse_args()

words = sa.io.csv.read(args.input, schema="word STRING", persistent_id="words_source")
word_counts = words.groupBy("word").count()
sa.io.jsonlines.write(word_counts, args.output)

config = None
if args.state:
    config = sa.persistence.Config.simple_config(
        sa.persistence.Backend.from_uri(args.state), snapshot_interval_ms=args.snapshot_interval_ms)
sa.run(persistence_config=config, trigger_interval_ms=args.trigger_interval_ms, stop_when_idle=args.stop_when_idle)
