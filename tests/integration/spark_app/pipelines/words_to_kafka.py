"""A test pipeline writing to Kafka: counts per word (a keyed changelog) and the rows with an
even n (append-only, keyed by word), read from a folder of CSV files."""

import argparse

from pyspark.sql import functions as F

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--input", required=True)
parser.add_argument("--out-dir", required=True)
parser.add_argument("--state", required=True)
parser.add_argument("--bootstrap-servers", required=True)
parser.add_argument("--topic", required=True, help="counts go to TOPIC, even rows to TOPIC-even")
parser.add_argument("--max-files-per-trigger", type=int, default=None)
parser.add_argument("--snapshot-interval-ms", type=int, default=2000)
parser.add_argument("--trigger-interval-ms", type=int, default=200)
parser.add_argument("--stop-when-idle", action="store_true")
args = parser.parse_args()

words = sa.io.csv.read(args.input, schema="word STRING, n INT", persistent_id="words",
                       max_files_per_trigger=args.max_files_per_trigger)
counts = words.groupBy("word").agg(F.count("*").alias("count"), F.sum("n").alias("total"))
sa.io.kafka.write(counts, args.topic, name="counts", bootstrap_servers=args.bootstrap_servers)
sa.io.kafka.write(words.filter("n % 2 = 0"), f"{args.topic}-even", key=["word"], name="even",
                  bootstrap_servers=args.bootstrap_servers)

sa.run(
    persistence_config=sa.persistence.Config.simple_config(
        sa.persistence.Backend.from_uri(args.state), snapshot_interval_ms=args.snapshot_interval_ms),
    trigger_interval_ms=args.trigger_interval_ms,
    stop_when_idle=args.stop_when_idle,
)
