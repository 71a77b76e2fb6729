"""The tests' Kafka broker (tests/support/kafka.py) does what the Kafka tests rely on: it runs
transactions on its single node, a read_committed reader sees exactly the committed ones, and
deleting records moves a partition's start as retention would."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kafka import BrokerDidNotStart, KafkaBroker, Message, start_broker

pytestmark = pytest.mark.kafka


def test_a_committed_transaction_is_read_once_and_an_aborted_one_never(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.new_topic(partitions=2)
    committed = [Message(b"a", b"1", (("source", b"t1"),), partition=0), Message(b"b", b"2", partition=1)]
    kafka_broker.produce(topic, committed, transactional_id="writer-1")
    kafka_broker.produce(topic, [Message(b"c", b"aborted", partition=0)], transactional_id="writer-1", abort=True)
    kafka_broker.produce(topic, [Message(b"d", b"3", partition=0)], transactional_id="writer-2")

    read = kafka_broker.consume_all(topic, read_committed=True)

    assert [(m.partition, m.key, m.value, m.headers) for m in read] == [
        (0, b"a", b"1", (("source", b"t1"),)),
        (0, b"d", b"3", ()),
        (1, b"b", b"2", ()),
    ]
    # The aborted record is in the log all the same: a read_uncommitted reader sees it.
    assert b"aborted" in [m.value for m in kafka_broker.consume_all(topic, read_committed=False)]
    # Each partition's end counts the records and the transactions' markers.
    assert kafka_broker.end_offsets(topic) == {0: 6, 1: 2}


def test_deleting_records_moves_the_log_start_offset(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.new_topic(partitions=1)
    kafka_broker.produce(topic, [Message(None, str(i).encode(), partition=0) for i in range(10)])
    assert kafka_broker.start_offsets(topic) == {0: 0}

    assert kafka_broker.delete_records(topic, {0: 4}) == {0: 4}

    assert kafka_broker.start_offsets(topic) == {0: 4}
    assert kafka_broker.end_offsets(topic) == {0: 10}
    assert [m.offset for m in kafka_broker.consume_all(topic)] == list(range(4, 10))


def test_partitions_can_be_added_to_a_topic(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.new_topic(partitions=1)
    kafka_broker.add_partitions(topic, 3)
    kafka_broker.produce(topic, [Message(b"k", b"v", partition=2)])
    assert kafka_broker.partitions(topic) == [0, 1, 2]
    assert kafka_broker.end_offsets(topic) == {0: 0, 1: 0, 2: 1}


def test_a_broker_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(BrokerDidNotStart, match="no Kafka broker jars in"):
        start_broker(tmp_path, jars=tmp_path / "no-jars")
