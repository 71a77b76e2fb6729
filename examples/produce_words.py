"""Writes words to a Kafka topic as JSON messages ({"word": "apple"}), all of them in one
transaction, and exits 0 once the broker committed it: a feeder for kafka_wordcount.py.

    python examples/produce_words.py --bootstrap-servers localhost:9092 --topic words apple banana apple

The topic is created (with --partitions) if it does not exist yet.
"""

import argparse
import json
import sys
import uuid

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

parser = argparse.ArgumentParser()
parser.add_argument("--bootstrap-servers", required=True)
parser.add_argument("--topic", required=True)
parser.add_argument("--partitions", type=int, default=2)
parser.add_argument("words", nargs="*", help="none: only create the topic")
args = parser.parse_args()

admin = AdminClient({"bootstrap.servers": args.bootstrap_servers})
if args.topic not in admin.list_topics(timeout=30).topics:
    created = admin.create_topics([NewTopic(args.topic, num_partitions=args.partitions, replication_factor=1)])
    try:
        created[args.topic].result(timeout=30)
    except KafkaException as error:  # another feeder created it first
        if "TOPIC_ALREADY_EXISTS" not in str(error):
            raise

producer = Producer({"bootstrap.servers": args.bootstrap_servers, "transactional.id": f"produce-words-{uuid.uuid4()}"})
producer.init_transactions(60)
producer.begin_transaction()
for word in args.words:
    producer.produce(args.topic, key=word.encode(), value=json.dumps({"word": word}).encode())
producer.commit_transaction(60)
print(f"wrote {len(args.words)} words to {args.topic}", file=sys.stderr)
