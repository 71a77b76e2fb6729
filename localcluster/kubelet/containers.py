"""The runtime state of one container of a pod, and how a finished run is recorded.

Owned by the pod worker's thread; probe threads only set `ready`, `startup_passed` and
`probe_failure`.
"""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass, field
from typing import Any

from localcluster.kubelet import status as st
from localcluster.kubelet.probes import Prober
from localcluster.kubelet.runtime import ContainerProcess

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Backoff:
    """CrashLoopBackOff and ImagePullBackOff delays: kubelet's 10s doubling to 5 minutes.
    The first restart after a crash is immediate."""

    initial: float = 10.0
    maximum: float = 300.0

    def next(self, current: float) -> float:
        return self.initial if current <= 0 else min(current * 2, self.maximum)


@dataclass
class Container:
    """Mutable runtime state of one container of the pod (owned by the worker thread;
    probe threads only set `ready`, `startup_passed` and `probe_failure`)."""

    spec: JsonDict
    init: bool
    restart_count: int = 0
    runs: int = 0
    process: ContainerProcess | None = None
    reason: str = "ContainerCreating"
    message: str = ""
    terminated: st.Terminated | None = None
    last_terminated: st.Terminated | None = None
    next_start: float = 0.0
    crash_backoff: float = 0.0
    retry_backoff: float = 0.0
    pull_failed_at: float | None = None
    ready: bool = False
    started: bool = False
    startup_passed: bool = False
    probe_failure: str | None = None
    kill_deadline: float | None = None
    probers: list[Prober] = field(default_factory=list)
    launch_env: dict[str, str] = field(default_factory=dict)
    launch_cwd: str = "/"
    image_id: str = ""

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def succeeded(self) -> bool:
        return self.terminated is not None and self.terminated.exit_code == 0

    def view(self) -> st.ContainerView:
        image = str(self.spec.get("image", ""))
        if self.process is not None:
            return st.ContainerView(
                self.name, image, "running", started_at=self.process.created_at,
                last_terminated=self.last_terminated, restart_count=self.restart_count,
                ready=self.ready, started=self.started, image_id=self.image_id,
                container_id=f"localcluster://{self.process.pid}",
            )  # fmt: skip
        if self.terminated is not None:
            return st.ContainerView(
                self.name, image, "terminated", terminated=self.terminated,
                last_terminated=self.last_terminated, restart_count=self.restart_count, image_id=self.image_id,
                container_id=self.terminated.container_id,
            )  # fmt: skip
        return st.ContainerView(
            self.name, image, "waiting", reason=self.reason, message=self.message,
            last_terminated=self.last_terminated, restart_count=self.restart_count, image_id=self.image_id,
        )  # fmt: skip

    def stop_probers(self) -> None:
        for prober in self.probers:
            prober.stop()
        self.probers = []


def should_restart(restart_policy: str, init: bool, exit_code: int) -> bool:
    if restart_policy == "Never":
        return False
    if restart_policy == "Always" and not init:
        return True
    return exit_code != 0


def restore_container(c: Container, previous: JsonDict, restart_policy: str) -> None:
    state = previous.get("state") or {}
    c.restart_count = int(previous.get("restartCount") or 0)
    if "terminated" in state:
        c.terminated = parse_terminated(state["terminated"])
        c.runs = 1
        return
    last = (previous.get("lastState") or {}).get("terminated")
    if "running" not in state:
        if last:  # it was waiting to restart: it restarts now
            c.last_terminated = parse_terminated(last)
            c.runs = 1
        return
    lost = st.Terminated(
        exit_code=137,
        reason="ContainerStatusUnknown",
        message="The container could not be located when the pod was terminated",
        finished_at=time.time(),
    )
    c.runs = 1
    if should_restart(restart_policy, c.init, lost.exit_code):
        c.last_terminated = lost
    else:
        c.terminated = lost


def parse_terminated(raw: JsonDict) -> st.Terminated:
    return st.Terminated(
        exit_code=int(raw.get("exitCode", 0)),
        reason=str(raw.get("reason", "")),
        finished_at=parse_time(raw.get("finishedAt")) or time.time(),
        started_at=parse_time(raw.get("startedAt")),
        message=str(raw.get("message", "")),
        container_id=str(raw.get("containerID", "")),
    )


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return float(calendar.timegm(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")))


def terminated_run(process: ContainerProcess) -> st.Terminated:
    assert process.exit_code is not None and process.finished_at is not None
    if process.start_error is not None:
        reason, message = "StartError", process.start_error
    else:
        reason, message = st.termination_reason(process.exit_code), process.termination_message
    return st.Terminated(
        exit_code=process.exit_code,
        reason=reason,
        finished_at=process.finished_at,
        started_at=process.started_at or process.created_at,
        message=message,
        signal=process.signal,
        container_id=f"localcluster://{process.pid}",
    )
