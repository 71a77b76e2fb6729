"""Helpers for tests and the demo against the local cluster: polling with a deadline,
small pod manifests, and killing a container's process as on a node (kubectl and helm are
localcluster.kubectl's).

    from localcluster.testing import wait_for, shell_pod, kill_container
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from localcluster.cluster import ClusterError, ClusterInfo
from localcluster.kubectl import KubeCommands
from localcluster.layout import Layout
from localcluster.procs import ProcessRecord, is_alive

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 30.0, every: float = 0.1,
             progress: Callable[[], None] | None = None) -> T:
    """Polls until probe() returns something truthy and returns it, calling progress()
    between polls; after the deadline, raises TimeoutError with `what` and the last value
    seen. Never retries past the deadline."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        if progress is not None:
            progress()
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last seen: {last!r})")


def shell_pod(
    name: str,
    script: str,
    *,
    image: str = "busybox:1.36",
    restart: str = "Never",
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    grace_seconds: int = 10,
    **container: Any,
) -> dict[str, Any]:
    """A one-container pod running `sh -c script`, or `python -c script` for python images."""
    shell = ["python", "-c"] if image.startswith("python") else ["sh", "-c"]
    main = {
        "name": "main",
        "image": image,
        "command": [*shell, script],
        "volumeMounts": mounts or [],
        **container,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": grace_seconds,
            "volumes": volumes or [],
            "containers": [main],
        },
    }


def phase_in(core: Any, namespace: str, name: str, *phases: str) -> Callable[[], Any]:
    """A wait_for probe: the pod (a kubernetes.client.V1Pod, read with `core`, a CoreV1Api)
    once its phase is one of `phases`, else None."""

    def probe() -> Any:
        found = core.read_namespaced_pod(name, namespace)
        return found if found.status.phase in phases else None

    return probe


def host_path(path: Path) -> dict[str, Any]:
    """A hostPath volume source for a folder, created if missing."""
    return {"path": str(path), "type": "DirectoryOrCreate"}


def kill_container(
    info: ClusterInfo,
    namespace: str,
    pod: str,
    container: str,
    sig: int = signal.SIGKILL,
    layout: Layout | None = None,
) -> int:
    """Sends `sig` to a running container's main process, as `kill` on a node would (the
    pod stays; the node agent then reports the exit, 128+sig). The process is the one the
    node agent recorded for the pod's uid (pid and start time, so a recycled pid is never
    hit). Returns the pid; ClusterError if the container is not running."""
    layout = layout or Layout.for_repo()
    commands = KubeCommands.for_repo(info.kubeconfig, layout)
    uid = commands.kubectl("get", "pod", "-n", namespace, pod, "-o", "jsonpath={.metadata.uid}").strip()
    pid_file = layout.pods_dir / uid / "containers" / container / "pid"
    try:
        pid, ticks = (int(x) for x in pid_file.read_text().split())
    except (OSError, ValueError):
        raise ClusterError(f"container {container} of pod {namespace}/{pod} is not running") from None
    if not is_alive(ProcessRecord(pid, ticks)):
        raise ClusterError(f"container {container} of pod {namespace}/{pod} has already exited")
    os.kill(pid, sig)
    return pid
