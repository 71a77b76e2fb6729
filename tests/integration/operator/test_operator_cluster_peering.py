"""Two operator replicas with kopf peering: only the one of higher priority serves; when it
stops, the other takes over. The drivers here are stand-ins (a shell through the pod
template): this is about the operators, not Spark."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from ppl_cluster import GROUP, VERSION, Namespace, Operator, eventually

pytestmark = [pytest.mark.cluster]

STAND_IN = ["sh", "-c", "trap 'kill $! 2>/dev/null; exit 0' TERM; sleep 100000 & wait"]


def stand_in(name: str) -> dict[str, object]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PersistentPipeline", "metadata": {"name": name}, "spec": {
        "application": {"file": "examples/wordcount.py"},
        "driver": {"terminationGracePeriodSeconds": 5,
                   "podTemplate": {"spec": {"containers": [{"name": "driver", "command": STAND_IN}]}}},
        "persistence": {"filesystem": {"claimName": "state"}},
        "restartPolicy": {"backoff": {"initialSeconds": 0, "maxSeconds": 0}},
    }}


def test_only_the_replica_of_highest_priority_serves_and_the_other_takes_over(ns: Namespace, tmp_path: Path) -> None:
    ns.custom.create_namespaced_custom_object("kopf.dev", "v1", ns.name, "kopfpeerings",
                                              {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                                               "metadata": {"name": "pipelines"}})
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    low = Operator(ns.cluster, ns.name, tmp_path / "low", "--peering=pipelines", "--priority=10")
    high = Operator(ns.cluster, ns.name, tmp_path / "high", "--peering=pipelines", "--priority=20")
    try:
        low.start()
        high.start()
        eventually("the low-priority replica pausing", lambda: "Pausing" in low.log(), timeout=30)
        ns.apply(stand_in("one"))
        eventually("a driver from the active replica", lambda: ns.driver("one", epoch=1), timeout=30)
        assert "persistent_pipeline_phase{" in high.metrics()
        assert 'pipeline="one"' not in low.metrics(), "the paused replica reconciled"

        high.stop(signal.SIGTERM)
        eventually("the low-priority replica resuming", lambda: "Resuming" in low.log(), timeout=60)
        ns.kill_driver("one")
        eventually("a relaunch by the remaining replica", lambda: ns.driver("one", epoch=2), timeout=60)
        assert 'pipeline="one"' in low.metrics()
    finally:
        high.stop()
        low.stop()
