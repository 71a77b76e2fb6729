"""A Kafka pipeline under the operator on the local control plane shows its consumer lag
where a user looks: status.checkpoint (per query, topic and partition, and the total),
the LAG column of `kubectl get ppl -o wide`, and the operator's lag metric.

The broker is the loopback test broker (tests/support/kafka.py); the driver pod, a process
on this host, reaches it at 127.0.0.1. A backlog read 20 records a batch keeps the lag
above 0 for minutes, so what the test sees is a real lag, not an empty report."""

from __future__ import annotations

import json
import re

import pytest
from ppl_cluster import Namespace, Operator, eventually, wordcount

from tests.support.kafka import KafkaBroker, Message

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.kafka]

BACKLOG = 3000


def test_the_consumer_lag_shows_in_status_the_lag_column_and_the_metric(
        ns: Namespace, operator: Operator, kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.new_topic(partitions=2)
    kafka_broker.produce(topic, [Message(None, json.dumps({"word": f"w{i % 7}"}).encode(), partition=i % 2)
                                 for i in range(BACKLOG)])
    ns.apply(wordcount("kafkacount", application={
        "file": "examples/kafka_wordcount.py",
        "args": ["--topic", topic, "--output", "/data/counts.jsonlines", "--trigger-interval-ms", "1000",
                 "--max-offsets-per-trigger", "20"],
    }, kafka={"bootstrapServers": kafka_broker.bootstrap_servers}))

    def lagging() -> dict[str, int] | None:
        checkpoint = ns.status("kafkacount").get("checkpoint") or {}
        partitions = ((checkpoint.get("queries") or {}).get("counts_jsonlines", {}).get("lag") or {}) \
            .get("words_topic", {}).get(topic)
        return partitions if partitions and checkpoint.get("lag", 0) > 0 else None

    partitions = eventually("a lag above 0 in status.checkpoint", lagging, timeout=240)
    assert set(partitions) == {"0", "1"} and 0 < sum(partitions.values()) < BACKLOG, partitions

    wide = ns.kubectl("get", "ppl", "kafkacount", "-o", "wide")
    header, row = wide.splitlines()[:2]
    lag_at = header.index("LAG")
    shown = re.match(r"\d+", row[lag_at:])
    assert shown and 0 < int(shown.group()) < BACKLOG, wide

    def metric() -> list[str]:
        return [line for line in operator.metrics().splitlines()
                if line.startswith("persistent_pipeline_source_lag{") and f'topic="{topic}"' in line]

    lines = eventually("the lag metric of both partitions", lambda: (found := metric()) and len(found) == 2 and found)
    assert all('source="words_topic"' in line and 'pipeline="kafkacount"' in line for line in lines), lines
