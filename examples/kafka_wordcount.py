"""Word count over a Kafka topic of JSON messages ({"word": "apple"}), persistent: offsets
commit with each batch, so a restarted driver carries on exactly where the last commit ended.

    python -m spark_app run examples/kafka_wordcount.py --topic words --bootstrap-servers localhost:9092 \\
        --output counts.jsonlines --state state/

Under the operator, --state and --bootstrap-servers are omitted: the persistence configuration
and the Kafka cluster (spec.kafka, its credentials from a Secret) come from the environment the
operator injects. With --output-topic the counts go to a Kafka topic instead, exactly once.
"""

import argparse

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--topic", default="words")
parser.add_argument("--bootstrap-servers", default=None, help="default: the PersistentPipeline's spec.kafka")
parser.add_argument("--output", default="result.jsonlines")
parser.add_argument("--output-topic", default=None, help="write the counts' changelog to this topic instead")
parser.add_argument("--state", default=None, help="a state folder or s3://bucket/prefix (default: injected)")
parser.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
parser.add_argument("--snapshot-interval-ms", type=int, default=10_000)
parser.add_argument("--trigger-interval-ms", type=int, default=1000)
parser.add_argument("--stop-when-idle", action="store_true")
args = parser.parse_args()

words = sa.io.kafka.read(args.topic, persistent_id="words_topic", format="json", schema="word STRING",
                         bootstrap_servers=args.bootstrap_servers, max_offsets_per_trigger=args.max_offsets_per_trigger)
word_counts = words.groupBy("word").count()
if args.output_topic:
    sa.io.kafka.write(word_counts, args.output_topic, bootstrap_servers=args.bootstrap_servers)
else:
    sa.io.jsonlines.write(word_counts, args.output)

config = None
if args.state:
    config = sa.persistence.Config.simple_config(
        sa.persistence.Backend.from_uri(args.state), snapshot_interval_ms=args.snapshot_interval_ms)
sa.run(persistence_config=config, trigger_interval_ms=args.trigger_interval_ms, stop_when_idle=args.stop_when_idle)
