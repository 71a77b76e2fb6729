"""A Kafka connection (spark_app.contract.KafkaConnection) as the two clients a driver uses
take it: Spark's Kafka source (``kafka.``-prefixed options of its JVM consumer) and
confluent-kafka (librdkafka: the sink's transactional producer, the admin client that lists
offsets). Credentials go into these settings inside the driver only; what prints a setting
(a log, an error) goes through ``contract.scrub_credentials``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_app.contract import KafkaConnection

CLIENT_TIMEOUT_S = 30.0
"""How long one admin request may take before the driver gives up on it."""

_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def spark_options(connection: KafkaConnection) -> dict[str, str]:
    """The options of Spark's Kafka source for ``connection``."""
    options = {
        "kafka.bootstrap.servers": connection.bootstrap_servers,
        "kafka.security.protocol": connection.security_protocol,
    }
    if connection.sasl_mechanism:
        options["kafka.sasl.mechanism"] = connection.sasl_mechanism
        options["kafka.sasl.jaas.config"] = (
            f"{_JAAS_MODULES[connection.sasl_mechanism]} required "
            f"username={_jaas_quoted(connection.username or '')} password={_jaas_quoted(connection.password or '')};"
        )
    if connection.tls and connection.ca_file:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = connection.ca_file
    return options


def _jaas_quoted(value: str) -> str:
    # JAAS options are double-quoted strings with backslash escapes.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def client_config(connection: KafkaConnection) -> dict[str, Any]:
    """confluent-kafka's settings for ``connection``."""
    config: dict[str, Any] = {
        "bootstrap.servers": connection.bootstrap_servers,
        "security.protocol": connection.security_protocol.lower(),
    }
    if connection.sasl_mechanism:
        config |= {"sasl.mechanism": connection.sasl_mechanism, "sasl.username": connection.username,
                   "sasl.password": connection.password}
    if connection.tls and connection.ca_file:
        config["ssl.ca.location"] = connection.ca_file
    return config


@dataclass(frozen=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


PartitionOffsets = dict[TopicPartition, int]


def parse_offsets(value: Mapping[str, Any] | str) -> PartitionOffsets:
    """Spark's Kafka offset (``{"topic": {"0": 42}}``, the next offset of each partition)."""
    raw = json.loads(value) if isinstance(value, str) else value
    return {TopicPartition(topic, int(p)): int(o) for topic, parts in raw.items() for p, o in parts.items()}


def offsets_json(offsets: PartitionOffsets) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tp, offset in sorted(offsets.items(), key=lambda item: (item[0].topic, item[0].partition)):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offset
    return out


class Admin:
    """The driver's admin client of one Kafka cluster: offsets of partitions, offsets a
    consumer group committed. Opened on first use, kept for the driver's life."""

    def __init__(self, connection: KafkaConnection) -> None:
        self._connection = connection
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            from confluent_kafka.admin import AdminClient

            self._client = AdminClient(client_config(self._connection))
        return self._client

    def earliest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets:
        """The first offset each partition still stores (its log start)."""
        from confluent_kafka.admin import OffsetSpec

        return self._list(partitions, OffsetSpec.earliest())

    def latest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets:
        """The offset after the last committed record of each partition (the last stable
        offset: what a read_committed reader, Spark's source here, reads up to)."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import OffsetSpec

        return self._list(partitions, OffsetSpec.latest(), isolation_level=IsolationLevel.READ_COMMITTED)

    def _list(self, partitions: Iterable[TopicPartition], spec: Any, **options: Any) -> PartitionOffsets:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka import TopicPartition as KafkaPartition

        wanted = list(partitions)
        if not wanted:
            return {}
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while True:
            request = {KafkaPartition(tp.topic, tp.partition): spec for tp in wanted}
            futures = self.client.list_offsets(request, request_timeout=CLIENT_TIMEOUT_S, **options)
            try:
                return {TopicPartition(tp.topic, tp.partition): future.result(timeout=CLIENT_TIMEOUT_S).offset
                        for tp, future in futures.items()}
            except KafkaException as error:
                # A partition added since the client last read its topic's metadata: it
                # answers from its cache. Read the topics' metadata again (they exist: no
                # auto-creation), then ask again. The client is kept, not replaced: a
                # dropped client may be destroyed from librdkafka's own thread, which aborts
                # (confluent-kafka-python#2129).
                unknown = error.args and isinstance(error.args[0], KafkaError) and \
                    error.args[0].code() == KafkaError._UNKNOWN_PARTITION
                if not unknown or time.monotonic() > deadline:
                    raise
                for topic in sorted({tp.topic for tp in wanted}):
                    self.client.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
                time.sleep(0.2)

    def topics(self) -> dict[str, list[int]]:
        """The cluster's topics and their partitions. Asks for all of them: a request naming
        a topic creates it on a broker with auto.create.topics.enable."""
        metadata = self.client.list_topics(timeout=CLIENT_TIMEOUT_S)
        return {name: sorted(topic.partitions) for name, topic in metadata.topics.items() if topic.error is None}

    def partitions(self, topics: Iterable[str]) -> list[TopicPartition]:
        """The partitions of ``topics`` (none for a topic that does not exist)."""
        known = self.topics()
        return [TopicPartition(topic, p) for topic in topics for p in known.get(topic, [])]
