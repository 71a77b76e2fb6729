"""Pods reach each other by Service name, as through cluster DNS: each pod's /etc/hosts maps
the Services' names to 127.0.0.1, where every pod listens (localcluster/kubelet/hosts.py);
and the Kafka broker of demo/kafka.yaml runs there, reached by its Service name."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from localcluster.kubectl import KubeCommands
from localcluster.layout import Layout
from localcluster.testing import phase_in, shell_pod, wait_for
from tests.support.kafka import free_ports

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[3]

SERVER = """
import socket
server = socket.create_server(("127.0.0.1", {port}))
while True:
    connection, _ = server.accept()
    connection.sendall(b"hello from the server pod")
    connection.close()
"""

CLIENT = """
import socket, sys
for name in ("echo", "echo.{ns}", "echo.{ns}.svc", "echo.{ns}.svc.cluster.local"):
    print(name, socket.gethostbyname(name))
try:
    socket.gethostbyname("no-such-service.{ns}.svc.cluster.local")
    sys.exit("a name that is no Service resolved")
except OSError:
    pass
with socket.create_connection(("echo", {port}), timeout=10) as connection:
    print(connection.recv(100).decode())
"""

LATE = """
import socket, sys, time
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        print("resolved", socket.gethostbyname("late.{ns}.svc"))
        sys.exit(0)
    except OSError:
        time.sleep(0.2)
sys.exit("late.{ns}.svc never resolved")
"""


def service(name: str, port: int, app: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": app}, "ports": [{"port": port}]},
    }


def logs(core: client.CoreV1Api, namespace: str, pod: str) -> str:
    return str(core.read_namespaced_pod_log(pod, namespace))


def test_a_pod_reaches_another_pods_service_by_its_name(core: client.CoreV1Api, namespace: str) -> None:
    [port] = free_ports(1)
    server = shell_pod("server", SERVER.format(port=port), image="python:3.11")
    server["metadata"]["labels"] = {"app": "echo"}
    core.create_namespaced_pod(namespace, server)
    core.create_namespaced_service(namespace, service("echo", port, "echo"))
    wait_for("the server pod to run", phase_in(core, namespace, "server", "Running"))

    core.create_namespaced_pod(namespace, shell_pod("client", CLIENT.format(ns=namespace, port=port), image="python:3.11"))
    found = wait_for("the client pod to end", phase_in(core, namespace, "client", "Succeeded", "Failed"))

    output = logs(core, namespace, "client")
    assert found.status.phase == "Succeeded", output
    assert f"echo.{namespace}.svc.cluster.local 127.0.0.1" in output
    assert "hello from the server pod" in output


def test_a_service_created_after_a_pod_started_becomes_resolvable_in_it(
    core: client.CoreV1Api, namespace: str
) -> None:
    core.create_namespaced_pod(namespace, shell_pod("waiter", LATE.format(ns=namespace), image="python:3.11"))
    wait_for("the pod to run", phase_in(core, namespace, "waiter", "Running"))
    core.create_namespaced_service(namespace, service("late", 9, "nothing"))
    found = wait_for("the pod to end", phase_in(core, namespace, "waiter", "Succeeded", "Failed"), timeout=40)
    assert found.status.phase == "Succeeded", logs(core, namespace, "waiter")


KAFKA_CLIENT = """
import sys, uuid
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

servers = {"bootstrap.servers": "kafka:9092"}
topic = "pod-" + uuid.uuid4().hex[:8]
admin = AdminClient(servers)
admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(60)
producer = Producer({**servers, "transactional.id": "pod-writer"})
producer.init_transactions(60)
for value, commit in ((b"committed", True), (b"aborted", False)):
    producer.begin_transaction()
    producer.produce(topic, value)
    producer.flush(60)
    producer.commit_transaction(60) if commit else producer.abort_transaction(60)
consumer = Consumer({**servers, "group.id": "pod-reader", "isolation.level": "read_committed",
                     "enable.partition.eof": True, "fetch.wait.max.ms": 10})
consumer.assign([TopicPartition(topic, 0, -2)])
values = []
while True:
    record = consumer.poll(30)
    if record is None:
        sys.exit("no end of partition within 30 s")
    if record.error():
        if record.error().code() == KafkaError._PARTITION_EOF:
            break
        sys.exit(str(record.error()))
    values.append(record.value())
print("read", values)
sys.exit(0 if values == [b"committed"] else 1)
"""


@pytest.fixture
def kafka_namespace(namespace: str) -> Iterator[str]:
    yield namespace
    # The broker's claim folder outlives the namespace on the local cluster.
    shutil.rmtree(Layout.for_repo().pv_dir / namespace, ignore_errors=True)


def test_the_demo_kafka_broker_runs_and_pipelines_reach_it_by_its_service_name(
    core: client.CoreV1Api, kube: KubeCommands, kafka_namespace: str
) -> None:
    namespace = kafka_namespace
    kube.kubectl("apply", "-n", namespace, "-f", str(ROOT / "demo" / "kafka.yaml"))

    def ready() -> bool:
        pods = core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/name=kafka").items
        statuses = [c for p in pods for c in p.status.container_statuses or ()]
        return bool(statuses) and all(c.ready for c in statuses)

    wait_for("the Kafka pod to be ready", ready, timeout=120, every=0.5)
    core.create_namespaced_pod(namespace, shell_pod("kafka-client", KAFKA_CLIENT, image="python:3.11"))
    found = wait_for("the client pod to end", phase_in(core, namespace, "kafka-client", "Succeeded", "Failed"),
                     timeout=120, every=0.5)  # fmt: skip
    output = logs(core, namespace, "kafka-client")
    assert found.status.phase == "Succeeded", output + logs(core, namespace, "kafka-0")[-3000:]
    assert "read [b'committed']" in output
