"""A test pipeline reading words from a Kafka topic: counts per word (a keyed output) and
the records with an even n (append-only), as pipelines/two_outputs.py does for files."""

import argparse

from pyspark.sql import functions as F

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--bootstrap-servers", default=None, help="default: the connection in the environment")
parser.add_argument("--topic", required=True)
parser.add_argument("--out-dir", required=True)
parser.add_argument("--state", required=True)
parser.add_argument("--format", default="json", choices=["json", "csv"])
parser.add_argument("--starting-offsets", default="earliest")
parser.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
parser.add_argument("--skip-data-loss", action="store_true", help="fail_on_data_loss=False")
parser.add_argument("--trigger-interval-ms", type=int, default=200)
parser.add_argument("--snapshot-interval-ms", type=int, default=2000)
parser.add_argument("--stop-when-idle", action="store_true")
args = parser.parse_args()

words = sa.io.kafka.read(args.topic, persistent_id="words", format=args.format, schema="word STRING, n INT",
                         bootstrap_servers=args.bootstrap_servers, starting_offsets=args.starting_offsets,
                         max_offsets_per_trigger=args.max_offsets_per_trigger,
                         fail_on_data_loss=not args.skip_data_loss)
counts = words.groupBy("word").agg(F.count("*").alias("count"), F.sum("n").alias("total"))
sa.io.jsonlines.write(counts, f"{args.out_dir}/counts.jsonlines")
sa.io.jsonlines.write(words.filter("n % 2 = 0"), f"{args.out_dir}/even.jsonlines")

sa.run(
    persistence_config=sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(args.state),
                                                           snapshot_interval_ms=args.snapshot_interval_ms),
    trigger_interval_ms=args.trigger_interval_ms,
    stop_when_idle=args.stop_when_idle,
)
