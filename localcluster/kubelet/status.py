"""Pod status as kubelet reports it, built from snapshots of our containers. Pure.

The phase and condition rules follow kubelet's getPhase and its status generator: a
container that never started keeps the pod Pending; a restarting one (waiting, with a
last termination) counts as stopped, so a crash-looping Always pod stays Running.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

JsonDict = dict[str, Any]
HOST_IP = "127.0.0.1"

ContainerState = Literal["waiting", "running", "terminated"]


@dataclass(frozen=True)
class Terminated:
    exit_code: int
    reason: str
    finished_at: float
    started_at: float | None = None
    message: str = ""
    signal: int | None = None
    container_id: str = ""


@dataclass(frozen=True)
class ContainerView:
    """A snapshot of one container, enough to write its containerStatus."""

    name: str
    image: str
    state: ContainerState = "waiting"
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: float | None = None
    terminated: Terminated | None = None
    last_terminated: Terminated | None = None
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    image_id: str = ""
    container_id: str = ""

    @property
    def succeeded(self) -> bool:
        return self.state == "terminated" and self.terminated is not None and self.terminated.exit_code == 0


def rfc3339(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def container_status(view: ContainerView) -> JsonDict:
    status: JsonDict = {
        "name": view.name,
        "image": view.image,
        "imageID": view.image_id,
        "ready": view.ready,
        "started": view.started,
        "restartCount": view.restart_count,
        "state": _state(view),
        "lastState": {"terminated": _terminated(view.last_terminated)} if view.last_terminated else {},
    }
    if view.container_id:
        status["containerID"] = view.container_id
    return status


def _state(view: ContainerView) -> JsonDict:
    if view.state == "running":
        return {"running": {"startedAt": rfc3339(view.started_at or time.time())}}
    if view.state == "terminated" and view.terminated is not None:
        return {"terminated": _terminated(view.terminated)}
    waiting: JsonDict = {"reason": view.reason}
    if view.message:
        waiting["message"] = view.message
    return {"waiting": waiting}


def _terminated(t: Terminated | None) -> JsonDict:
    assert t is not None
    out: JsonDict = {"exitCode": t.exit_code, "reason": t.reason, "finishedAt": rfc3339(t.finished_at)}
    if t.started_at is not None:
        out["startedAt"] = rfc3339(t.started_at)
    if t.message:
        out["message"] = t.message
    if t.signal:
        out["signal"] = t.signal
    if t.container_id:
        out["containerID"] = t.container_id
    return out


def init_done(init_views: Sequence[ContainerView]) -> bool:
    return all(v.succeeded for v in init_views)


def pod_phase(
    restart_policy: str, init_views: Sequence[ContainerView], views: Sequence[ContainerView]
) -> str:
    if not init_done(init_views):
        init_failed = any(_failed_or_restarting(v) for v in init_views)
        return "Failed" if init_failed and restart_policy == "Never" else "Pending"
    waiting = sum(v.state == "waiting" and v.last_terminated is None for v in views)
    running = sum(v.state == "running" for v in views)
    stopped = sum(
        v.state == "terminated" or (v.state == "waiting" and v.last_terminated is not None) for v in views
    )
    succeeded = sum(v.succeeded for v in views)
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if stopped:
        if restart_policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        return "Failed" if restart_policy == "Never" else "Running"
    return "Pending"


def _failed_or_restarting(view: ContainerView) -> bool:
    if view.state == "terminated":
        return not view.succeeded
    return view.last_terminated is not None and view.last_terminated.exit_code != 0


def pod_conditions(
    phase: str,
    init_views: Sequence[ContainerView],
    views: Sequence[ContainerView],
    previous: Sequence[JsonDict],
    now: float,
) -> list[JsonDict]:
    """PodReadyToStartContainers, Initialized, Ready, ContainersReady, PodScheduled; a
    condition keeps its lastTransitionTime while its status does not change."""
    terminal = phase in ("Succeeded", "Failed")
    pending_init = [v.name for v in init_views if not v.succeeded]
    unready = [v.name for v in views if not v.ready]
    if terminal:
        ready = ("False", "PodCompleted", "")
    elif unready:
        ready = ("False", "ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]")
    else:
        ready = ("True", "", "")
    initialized = ("True", "", "")
    if pending_init:
        initialized = (
            "False",
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(pending_init)}]",
        )
    wanted = {
        "PodReadyToStartContainers": ("True", "", ""),
        "Initialized": initialized,
        "Ready": ready,
        "ContainersReady": ready,
        "PodScheduled": ("True", "", ""),
    }
    old = {c["type"]: c for c in previous}
    return [_condition(kind, *values, old.get(kind), now) for kind, values in wanted.items()]


def _condition(
    kind: str, status: str, reason: str, message: str, old: JsonDict | None, now: float
) -> JsonDict:
    condition: JsonDict = {"type": kind, "status": status, "lastProbeTime": None}
    unchanged = old is not None and old.get("status") == status and old.get("lastTransitionTime")
    condition["lastTransitionTime"] = old["lastTransitionTime"] if unchanged and old else rfc3339(now)
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def pod_status(
    restart_policy: str,
    init_views: Sequence[ContainerView],
    views: Sequence[ContainerView],
    previous: Mapping[str, Any],
    start_time: float,
    now: float,
) -> JsonDict:
    """The whole status stanza, for a merge patch of pods/status."""
    phase = pod_phase(restart_policy, init_views, views)
    return {
        "phase": phase,
        "conditions": pod_conditions(phase, init_views, views, previous.get("conditions") or (), now),
        # All pods share the host network (see README): the pod IP is the loopback address.
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "podIP": HOST_IP,
        "podIPs": [{"ip": HOST_IP}],
        "startTime": previous.get("startTime") or rfc3339(start_time),
        "initContainerStatuses": [container_status(v) for v in init_views],
        "containerStatuses": [container_status(v) for v in views],
    }


def exit_code_of(returncode: int) -> tuple[int, int | None]:
    """Popen's returncode -> (exit code as a container runtime reports it, signal).
    A process killed by signal N exits with 128+N, as in a shell."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


# kubelet's limits (pkg/kubelet/container): the file is read up to 4 KiB; the fallback
# takes the last 80 lines of the log, at most 2 KiB.
MAX_TERMINATION_MESSAGE_BYTES = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048


def termination_message(file_content: bytes, log_tail: bytes, policy: str, exit_code: int) -> str:
    """The terminated state's message: the container's termination message file, or with
    FallbackToLogsOnError and a failed run that wrote none, the tail of its log."""
    message = file_content[:MAX_TERMINATION_MESSAGE_BYTES]
    if not message and policy == "FallbackToLogsOnError" and exit_code != 0:
        message = log_tail[-FALLBACK_LOG_BYTES:]
    return message.decode(errors="replace")


def termination_reason(exit_code: int) -> str:
    return "Completed" if exit_code == 0 else "Error"
