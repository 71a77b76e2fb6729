"""Pods reach each other by Service name, as through cluster DNS: each pod's /etc/hosts maps
the Services' names to 127.0.0.1, where every pod listens (localcluster/kubelet/hosts.py)."""

from __future__ import annotations

import pytest
from kubernetes import client

from localcluster.testing import phase_in, shell_pod, wait_for
from tests.support.kafka import free_ports

pytestmark = pytest.mark.cluster

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
