"""The node agent's pure decisions: which pods it binds, restarts and back-off."""

from pathlib import Path
from typing import Any

import pytest

from localcluster.kubelet import storage
from localcluster.kubelet.containers import Backoff, should_restart
from localcluster.kubelet.node import HostFacts, lease_object, micro_time, node_object
from localcluster.node_agent import schedulable


def pending(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": dict(spec),
        "status": {"phase": "Pending"},
    }


def test_binds_pending_pods_of_the_default_scheduler_that_fit_the_node() -> None:
    labels = {"kubernetes.io/os": "linux"}
    assert schedulable(pending(), labels)
    assert schedulable(pending(nodeSelector={"kubernetes.io/os": "linux"}), labels)
    assert not schedulable(pending(nodeSelector={"gpu": "true"}), labels)
    assert not schedulable(pending(schedulerName="volcano"), labels)
    assert not schedulable(pending(nodeName="other"), labels)


@pytest.mark.parametrize(
    ("policy", "init", "code", "restart"),
    [
        ("Never", False, 1, False),
        ("Always", False, 0, True),
        ("OnFailure", False, 0, False),
        ("OnFailure", False, 2, True),
        ("Always", True, 0, False),
        ("Always", True, 1, True),
    ],
)
def test_restart_policy(policy: str, init: bool, code: int, restart: bool) -> None:
    assert should_restart(policy, init, code) is restart


def test_backoff_doubles_from_ten_seconds_to_five_minutes() -> None:
    backoff, delays = Backoff(), []
    current = 0.0
    for _ in range(7):
        current = backoff.next(current)
        delays.append(current)
    assert delays == [10, 20, 40, 80, 160, 300, 300]


def test_node_reports_ready_with_its_kubelet_port_and_lease_micro_time() -> None:
    facts = HostFacts(2, 1024, "6.1", "Debian", "amd64", "m", "b")
    node = node_object("local-node", facts, 10250, now=0.0)
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    assert lease_object("local-node", "uid", 1.5)["spec"]["renewTime"] == "1970-01-01T00:00:01.500000Z"
    assert micro_time(0.25).endswith(".250000Z")


def test_pending_claims_of_the_default_class_get_a_volume_on_their_folder() -> None:
    claim: dict[str, Any] = {
        "metadata": {"name": "state", "namespace": "ns", "uid": "u-1"},
        "spec": {
            "storageClassName": "local-path",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "2Gi"}},
        },
        "status": {"phase": "Pending"},
    }
    assert storage.needs_volume(claim)
    volume = storage.volume_for(claim, Path("/c/pv"))
    assert volume["metadata"]["name"] == "pvc-u-1"
    assert volume["spec"]["hostPath"]["path"] == "/c/pv/ns/state"
    assert volume["spec"]["claimRef"]["uid"] == "u-1"
    assert volume["spec"]["capacity"] == {"storage": "2Gi"}
    assert not storage.needs_volume({**claim, "spec": {**claim["spec"], "volumeName": "pvc-u-1"}})
    assert not storage.needs_volume({**claim, "spec": {**claim["spec"], "storageClassName": "fast"}})
    assert (
        storage.storage_class()["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"]
        == "true"
    )
