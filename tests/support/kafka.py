"""A real Kafka broker on loopback for the tests, and the few client operations they need.

`kafka_broker` (session) starts one KRaft node, broker and controller, as a process: the
runner the local cluster uses for the `apache/kafka` image (localcluster/kafka.py), from the
jars `make kafka` fetched, on free ports of 127.0.0.1, its data under the session's temporary
folder and its output in `kafka.log` beside it. It is stopped by its pid at the end.

The client is confluent-kafka (librdkafka): transactions, read_committed, offsets listing and
delete-records, as a Kafka client in production has them.

    def test_x(kafka_broker: KafkaBroker) -> None:
        topic = kafka_broker.new_topic(partitions=2)
        kafka_broker.produce(topic, [Message(b"k", b"v")], transactional_id="t1")
        assert [m.value for m in kafka_broker.consume_all(topic)] == [b"v"]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic, OffsetSpec

from localcluster.kafka import DEFAULT_JARS, NodeSettings, new_cluster_id
from localcluster.procs import free_port

START_SECONDS = 90.0
STOP_SECONDS = 20.0
CLIENT_SECONDS = 30.0
LOG_TAIL_LINES = 40

T = TypeVar("T")


@dataclass(frozen=True)
class Message:
    """A record to produce, or one that was read (then with its partition and offset)."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None
    """Where to produce it (None: the default partitioner chooses), or where it was read."""
    offset: int | None = None
    """Where it was read; None for a record to produce."""


class BrokerDidNotStart(RuntimeError):
    pass


@dataclass(frozen=True)
class KafkaBroker:
    bootstrap_servers: str
    """host:port of the PLAINTEXT listener."""
    pid: int
    log_path: Path
    sasl_bootstrap_servers: str | None = None
    """host:port of the SASL_PLAINTEXT listener (mechanism PLAIN), if the broker has one."""
    sasl_ssl_bootstrap_servers: str | None = None
    """host:port of the SASL_SSL listener (PLAIN over TLS), if the broker has one."""
    ca_file: Path | None = None
    """The PEM certificate of the CA that signed the SASL_SSL listener's (for 127.0.0.1)."""

    # ---- topics ------------------------------------------------------------------------

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None) -> None:
        topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=dict(config or {}))
        admin = self.admin()  # held until the answer: a destroyed client fails its futures
        _result(admin.create_topics([topic], operation_timeout=CLIENT_SECONDS)[name])
        self._wait_for_partitions(name, partitions)

    def new_topic(self, partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
        """A topic of its own (a fresh name), created with `partitions` partitions."""
        name = f"test-{uuid.uuid4().hex[:12]}"
        self.create_topic(name, partitions, config)
        return name

    def add_partitions(self, topic: str, total: int) -> None:
        """Grows the topic to `total` partitions."""
        admin = self.admin()
        _result(admin.create_partitions([NewPartitions(topic, total)], operation_timeout=CLIENT_SECONDS)[topic])
        self._wait_for_partitions(topic, total)

    def _wait_for_partitions(self, topic: str, count: int) -> None:
        """Returns once the broker's metadata lists `count` partitions of the topic. The admin
        call is answered when the controller has committed the change; the broker applies it
        to the metadata it serves a moment later, and a producer that asks in between is
        told of the old partitions only (its write to a new one fails "Unknown partition")."""
        admin, deadline = self.admin(), time.monotonic() + CLIENT_SECONDS
        while True:
            found = admin.list_topics(topic, timeout=CLIENT_SECONDS).topics[topic]
            if found.error is None and len(found.partitions) >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not listed with {count} partitions in {CLIENT_SECONDS:.0f} s")
            time.sleep(0.05)

    def partitions(self, topic: str) -> list[int]:
        metadata = self.admin().list_topics(topic, timeout=CLIENT_SECONDS)
        found = metadata.topics[topic]
        if found.error is not None:
            raise KafkaException(found.error)
        return sorted(found.partitions)

    # ---- records -----------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        messages: Iterable[Message],
        transactional_id: str | None = None,
        abort: bool = False,
    ) -> None:
        """Writes the messages and waits for every one to be acknowledged by the broker.
        With a transactional id they are one transaction, committed, or aborted if `abort`
        (after they reached the log)."""
        config = {"bootstrap.servers": self.bootstrap_servers, "acks": "all", "enable.idempotence": True}
        if transactional_id is not None:
            config["transactional.id"] = transactional_id
        elif abort:
            raise ValueError("only a transaction can be aborted: give a transactional_id")
        producer = Producer(config)
        failures: list[KafkaError] = []

        def delivered(error: KafkaError | None, _: object) -> None:
            if error is not None:
                failures.append(error)

        if transactional_id is not None:
            producer.init_transactions(CLIENT_SECONDS)
            producer.begin_transaction()
        for m in messages:
            producer.produce(
                topic, value=m.value, key=m.key, headers=list(m.headers) or None,
                partition=-1 if m.partition is None else m.partition, on_delivery=delivered,
            )  # fmt: skip
        # Flushed before an abort too: the aborted records are then in the log, as when a
        # writer dies mid-transaction (an abort of unsent records would just drop them).
        remaining = producer.flush(CLIENT_SECONDS)
        if remaining:
            raise TimeoutError(f"{remaining} messages to {topic} not acknowledged in {CLIENT_SECONDS:.0f} s")
        if failures:
            raise KafkaException(failures[0])
        if transactional_id is not None and abort:
            producer.abort_transaction(CLIENT_SECONDS)
        elif transactional_id is not None:
            producer.commit_transaction(CLIENT_SECONDS)

    def consume_all(self, topic: str, read_committed: bool = True) -> list[Message]:
        """Every record of every partition from its start to its end as of now, in partition
        then offset order; with read_committed, as a transactional reader sees them (aborted
        records and uncommitted ones left out, the end being the last stable offset)."""
        consumer = Consumer({
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": f"test-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            # At the end of a partition a fetch waits this long for new records before the EOF.
            "fetch.wait.max.ms": 10,
            "isolation.level": "read_committed" if read_committed else "read_uncommitted",
        })  # fmt: skip
        try:
            partitions = self.partitions(topic)
            consumer.assign([TopicPartition(topic, p, _OFFSET_BEGINNING) for p in partitions])
            return _read_to_eof(consumer, set(partitions))
        finally:
            consumer.close()

    def end_offsets(self, topic: str, read_committed: bool = False) -> dict[int, int]:
        """Partition -> the offset the next record will get (read_committed: the last stable offset)."""
        level = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
        return self._list_offsets(topic, OffsetSpec.latest(), isolation_level=level)

    def start_offsets(self, topic: str) -> dict[int, int]:
        """Partition -> its log start offset (the first record still stored)."""
        return self._list_offsets(topic, OffsetSpec.earliest())

    def delete_records(self, topic: str, before: Mapping[int, int]) -> dict[int, int]:
        """Deletes each partition's records below the given offset, as retention would; returns
        the partitions' new log start offsets."""
        requests = [TopicPartition(topic, partition, offset) for partition, offset in before.items()]
        admin = self.admin()
        futures = admin.delete_records(requests, operation_timeout=CLIENT_SECONDS)
        return {tp.partition: _result(future).low_watermark for tp, future in futures.items()}

    def _list_offsets(self, topic: str, spec: OffsetSpec, **options: Any) -> dict[int, int]:
        request = {TopicPartition(topic, p): spec for p in self.partitions(topic)}
        admin = self.admin()
        futures = admin.list_offsets(request, request_timeout=CLIENT_SECONDS, **options)
        return {tp.partition: _result(future).offset for tp, future in futures.items()}


_OFFSET_BEGINNING = -2


def _read_to_eof(consumer: Consumer, partitions: set[int]) -> list[Message]:
    deadline = time.monotonic() + CLIENT_SECONDS
    pending = set(partitions)
    read: list[Message] = []
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"partitions {sorted(pending)} not read to their end in {CLIENT_SECONDS:.0f} s")
        record = consumer.poll(1.0)
        if record is None:
            continue
        error = record.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                pending.discard(record.partition())
                continue
            raise KafkaException(error)
        headers = tuple((name, value or b"") for name, value in record.headers() or ())
        read.append(Message(record.key(), record.value(), headers, record.partition(), record.offset()))
    return sorted(read, key=lambda m: (m.partition or 0, m.offset or 0))


def _result(future: Future[T]) -> T:
    return future.result(timeout=CLIENT_SECONDS)


# ---- the broker process -------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """Ports of 127.0.0.1 that nothing listens on now, all different (localcluster.procs.free_port)."""
    return [free_port() for _ in range(count)]


def start_broker(folder: Path, jars: Path = DEFAULT_JARS, sasl_users: Mapping[str, str] | None = None,
                 tls: bool = False) -> tuple[subprocess.Popen[bytes], KafkaBroker]:
    """Starts a broker whose data, configuration and log live in `folder`; returns once it
    answers a metadata request, or raises BrokerDidNotStart with its log's tail. With
    `sasl_users` (name -> password) it also listens for SASL_PLAINTEXT clients (PLAIN), and
    with `tls` for SASL_SSL ones too, with a certificate of a CA made for it (`ca_file`)."""
    folder.mkdir(parents=True, exist_ok=True)  # a test's tmp_path exists; the benchmark's subfolder not yet
    port, controller_port, sasl_port, sasl_ssl_port = free_ports(4)
    node = NodeSettings(log_dir=str(folder / "data"), port=port, controller_port=controller_port)
    env = {key: os.environ[key] for key in ("PATH", "JAVA_HOME", "LANG") if key in os.environ}
    env |= node.image_env()
    ca_file: Path | None = None
    if sasl_users:
        env |= _sasl_listener_env(env, "SASL_PLAINTEXT", sasl_port, sasl_users)
        if tls:
            ca_file, keystore = _certificates(folder / "tls")
            env |= _sasl_listener_env(env, "SASL_SSL", sasl_ssl_port, sasl_users)
            env |= {"KAFKA_SSL_KEYSTORE_TYPE": "PEM", "KAFKA_SSL_KEYSTORE_LOCATION": str(keystore)}
    env |= {
        "CLUSTER_ID": new_cluster_id(),
        # Small: a test broker holds little, and it shares the machine with Spark drivers.
        "KAFKA_HEAP_OPTS": "-Xmx512M -Xms128M",
    }
    log_path = folder / "kafka.log"
    command = [sys.executable, "-m", "localcluster.kafka", "--jars", str(jars), "--config-dir", str(folder / "config")]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=folder, start_new_session=True,
        )  # fmt: skip
    broker = KafkaBroker(f"127.0.0.1:{port}", process.pid, log_path,
                         f"127.0.0.1:{sasl_port}" if sasl_users else None,
                         f"127.0.0.1:{sasl_ssl_port}" if ca_file else None, ca_file)
    try:
        _wait_until_ready(process, broker)
    except BaseException:
        stop_broker(process)
        raise
    return process, broker


def _sasl_listener_env(env: Mapping[str, str], protocol: str, port: int, users: Mapping[str, str]
                       ) -> dict[str, str]:
    """The image's variables for one more listener, named as its ``protocol`` (SASL_PLAINTEXT
    or SASL_SSL), with PLAIN and these users."""
    accounts = " ".join(f'user_{name}="{password}"' for name, password in users.items())
    return {
        "KAFKA_LISTENERS": env["KAFKA_LISTENERS"] + f",{protocol}://127.0.0.1:{port}",
        "KAFKA_ADVERTISED_LISTENERS": env["KAFKA_ADVERTISED_LISTENERS"] + f",{protocol}://127.0.0.1:{port}",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"] + f",{protocol}:{protocol}",
        "KAFKA_SASL_ENABLED_MECHANISMS": "PLAIN",
        # listener.name.<protocol>.plain.sasl.jaas.config (the image's rule: "__" is "_")
        f"KAFKA_LISTENER_NAME_{protocol.replace('_', '__')}_PLAIN_SASL_JAAS_CONFIG":
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {accounts};",
    }


def _certificates(folder: Path) -> tuple[Path, Path]:
    """A CA and a certificate it signs for 127.0.0.1, made with openssl: (the CA's PEM, the
    broker's PEM key store: its unencrypted PKCS#8 key, then its certificate chain)."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=spark-app test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
            "-subj", "/CN=127.0.0.1")
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "broker.crt", "-days", "2", "-extfile", "san.ext")
    keystore = folder / "broker.pem"
    keystore.write_text("".join((folder / name).read_text() for name in ("broker.key", "broker.crt", "ca.crt")))
    return folder / "ca.crt", keystore


def _wait_until_ready(process: subprocess.Popen[bytes], broker: KafkaBroker) -> None:
    deadline = time.monotonic() + START_SECONDS
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers, "socket.connection.setup.timeout.ms": 1000})
    while True:
        if _exited(process.pid):
            raise BrokerDidNotStart(
                "the Kafka broker exited before it was ready; "
                f"the end of {broker.log_path}:\n{_tail(broker.log_path)}"
            )
        try:
            if admin.list_topics(timeout=1.0).brokers:
                return
        except KafkaException:
            pass
        if time.monotonic() > deadline:
            raise BrokerDidNotStart(
                f"the Kafka broker did not answer on {broker.bootstrap_servers} within {START_SECONDS:.0f} s; "
                f"the end of {broker.log_path}:\n{_tail(broker.log_path)}"
            )
        time.sleep(0.2)


def stop_broker(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (Kafka shuts down cleanly), then SIGKILL to its process group if it lingers."""
    deadline = time.monotonic() + STOP_SECONDS
    if not _exited(process.pid):
        process.send_signal(signal.SIGTERM)
        while not _exited(process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    # The group is the runner's session, so nothing it started outlives it; the process is not
    # reaped yet, so its pid (the group's id) cannot have gone to another process.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it."""
    status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return status is not None


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(lines[-LOG_TAIL_LINES:])


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A Kafka broker on 127.0.0.1 for the whole session (see the module's docstring)."""
    process, broker = start_broker(tmp_path_factory.mktemp("kafka"))
    yield broker
    stop_broker(process)
