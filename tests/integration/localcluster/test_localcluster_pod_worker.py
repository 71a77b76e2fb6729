"""The pod worker against a fake API server: real processes (it needs root for their mount
namespaces, as the cluster does) but no cluster, so the API can fail on demand."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from localcluster.kubeapi import ApiUnavailable
from localcluster.kubelet.images import load_image_map
from localcluster.kubelet.pods import PodContext, PodWorker
from localcluster.layout import Layout
from localcluster.testing import host_path, shell_pod, wait_for

pytestmark = pytest.mark.cluster
LAYOUT = Layout.for_repo()


class FakeApi:
    """Records status patches and deletes; `down` makes every call fail like a dead apiserver."""

    def __init__(self) -> None:
        self.down = False
        self.statuses: list[dict[str, Any]] = []
        self.failed_patches = 0
        self.deletes: list[dict[str, Any]] = []

    def patch(self, path: str, body: dict[str, Any], content_type: str = "") -> dict[str, Any]:
        if self.down:
            self.failed_patches += 1
            raise ApiUnavailable(ConnectionRefusedError("connection refused"))
        self.statuses.append(body["status"])
        return body

    def delete(self, path: str, body: Any = None) -> dict[str, Any]:
        self.deletes.append(body)
        return {}

    def get_or_none(self, path: str) -> None:
        return None  # as for a 404: these pods refer to no object


class NoEvents:
    def normal(self, *args: Any, **kwargs: Any) -> None: ...

    def warning(self, *args: Any, **kwargs: Any) -> None: ...


def worker_for(manifest: dict[str, Any], tmp_path: Path, api: FakeApi) -> tuple[PodWorker, threading.Event]:
    placeholders = {"repo": str(LAYOUT.repo), "venv": str(LAYOUT.venv), "python": str(LAYOUT.python)}
    images = load_image_map(LAYOUT.images_file.read_text(), placeholders)
    ctx = PodContext(
        api=api,  # type: ignore[arg-type]
        events=NoEvents(),  # type: ignore[arg-type]
        node_name="local-node",
        apiserver_host="127.0.0.1",
        apiserver_port=1,
        pods_dir=tmp_path / "pods",
        pv_dir=tmp_path / "pv",
        logs_root=tmp_path / "logs",
        python=str(LAYOUT.python),
        images=lambda: images,
        host_env={},
    )
    manifest["metadata"].update(namespace="ns", uid=f"uid-{time.monotonic_ns()}")
    manifest["spec"]["nodeName"] = "local-node"
    done = threading.Event()
    worker = PodWorker(manifest, ctx, lambda _: done.set())
    worker.start()
    return worker, done


def phases(api: FakeApi) -> list[str]:
    return [s["phase"] for s in api.statuses]


def test_an_exit_during_an_apiserver_outage_is_reported_once_it_is_back(tmp_path: Path) -> None:
    api = FakeApi()
    _, done = worker_for(shell_pod("p", "sleep 0.5; exit 5"), tmp_path, api)
    wait_for("Running to be reported", lambda: "Running" in phases(api), timeout=10)
    api.down = True
    wait_for("a failed attempt to report the exit", lambda: api.failed_patches > 0, timeout=10)
    assert not done.is_set(), "the worker must not stop before the API knows the pod failed"
    api.down = False
    wait_for("the worker to finish", done.is_set, timeout=10)
    final = api.statuses[-1]
    assert final["phase"] == "Failed"
    assert final["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 5


def test_deletion_stops_the_process_reports_and_removes_the_pod(tmp_path: Path) -> None:
    api = FakeApi()
    # The shell says when its trap is set: SIGTERM before that would kill it (exit 143).
    manifest = shell_pod("p", 'trap "exit 9" TERM; touch /marks/trapped; while true; do sleep 0.05; done',
                         volumes=[{"name": "marks", "hostPath": host_path(tmp_path / "marks")}],
                         mounts=[{"name": "marks", "mountPath": "/marks"}])
    worker, done = worker_for(manifest, tmp_path, api)
    wait_for("Running to be reported", lambda: "Running" in phases(api), timeout=10)
    wait_for("the trap to be set", (tmp_path / "marks" / "trapped").exists, timeout=10)
    deleting = dict(manifest, metadata=dict(manifest["metadata"], deletionTimestamp="2030-01-01T00:00:00Z"))
    worker.update(deleting)
    wait_for("the worker to finish", done.is_set, timeout=10)
    final = api.statuses[-1]
    assert final["phase"] == "Failed"
    assert final["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 9
    assert api.deletes == [
        {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": manifest["metadata"]["uid"]},
        }
    ]
    assert not (tmp_path / "pods" / manifest["metadata"]["uid"]).exists()
