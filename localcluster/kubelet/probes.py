"""Startup, readiness and liveness probes: httpGet, tcpSocket and exec, with kubelet's timing.

One thread per probe of a running container, stopped when that run of the container ends.
exec probes run inside the container's mount namespace (nsenter) with its environment.
"""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

JsonDict = dict[str, Any]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeTiming:
    initial_delay: float
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int


def probe_timing(probe: JsonDict) -> ProbeTiming:
    """Kubernetes' defaults for the unset fields."""
    return ProbeTiming(
        initial_delay=float(probe.get("initialDelaySeconds") or 0),
        period=float(probe.get("periodSeconds") or 10),
        timeout=float(probe.get("timeoutSeconds") or 1),
        success_threshold=int(probe.get("successThreshold") or 1),
        failure_threshold=int(probe.get("failureThreshold") or 3),
    )


def resolve_port(port: int | str, container: JsonDict) -> int:
    """A probe port is a number or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports") or ():
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"port {port!r} is not a named port of container {container.get('name')!r}")


@dataclass(frozen=True)
class ProbeTarget:
    """What an exec probe needs to enter the container."""

    pid: int
    env: Mapping[str, str]
    cwd: str


def check(probe: JsonDict, container: JsonDict, target: ProbeTarget, timeout: float) -> tuple[bool, str]:
    """Runs a probe once: (success, what failed)."""
    try:
        if "httpGet" in probe:
            return _http_get(probe["httpGet"], container, timeout)
        if "tcpSocket" in probe:
            return _tcp_socket(probe["tcpSocket"], container, timeout)
        if "exec" in probe:
            return _exec(probe["exec"], target, timeout)
    except (OSError, ValueError, subprocess.SubprocessError, http.client.HTTPException) as e:
        return False, str(e) or type(e).__name__
    # grpc probes: there is no gRPC health client here; count them as passing.
    return True, ""


def _http_get(action: JsonDict, container: JsonDict, timeout: float) -> tuple[bool, str]:
    host = action.get("host") or "127.0.0.1"
    port = resolve_port(action["port"], container)
    path = action.get("path") or "/"
    headers = {h["name"]: h["value"] for h in action.get("httpHeaders") or ()}
    if action.get("scheme", "HTTP").upper() == "HTTPS":
        # Like kubelet: HTTPS probes do not verify the certificate.
        context = ssl._create_unverified_context()
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=context
        )
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path, headers=headers)
        status = connection.getresponse().status
    finally:
        connection.close()
    if 200 <= status < 400:
        return True, ""
    return False, f"HTTP probe failed with statuscode: {status}"


def _tcp_socket(action: JsonDict, container: JsonDict, timeout: float) -> tuple[bool, str]:
    host = action.get("host") or "127.0.0.1"
    with socket.create_connection((host, resolve_port(action["port"], container)), timeout=timeout):
        return True, ""


def _exec(action: JsonDict, target: ProbeTarget, timeout: float) -> tuple[bool, str]:
    argv = ["nsenter", f"--target={target.pid}", "--mount", f"--wd={target.cwd}", "--", *action["command"]]
    result = subprocess.run(argv, env=dict(target.env), capture_output=True, timeout=timeout, check=False)
    if result.returncode == 0:
        return True, ""
    output = (result.stdout + result.stderr).decode(errors="replace").strip()
    return False, f"command exited with {result.returncode}: {output[-200:]}"


class Prober:
    """Runs one probe periodically; calls on_change(success, message) when the result,
    after successThreshold/failureThreshold, flips. A restarted container gets new Probers."""

    def __init__(
        self,
        kind: str,
        probe: JsonDict,
        container: JsonDict,
        target: ProbeTarget,
        on_change: Callable[[bool, str], None],
    ) -> None:
        self.kind = kind
        self._probe = probe
        self._container = container
        self._target = target
        self._timing = probe_timing(probe)
        self._on_change = on_change
        self._stop = threading.Event()
        name = f"probe-{kind}-{container['name']}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        timing = self._timing
        successes = failures = 0
        result: bool | None = None
        if self._stop.wait(timing.initial_delay):
            return
        while not self._stop.is_set():
            ok, message = check(self._probe, self._container, self._target, timing.timeout)
            if self._stop.is_set():
                return
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if ok and successes >= timing.success_threshold and result is not True:
                result = True
                self._on_change(True, "")
            elif not ok and failures >= timing.failure_threshold and result is not False:
                result = False
                self._on_change(False, message)
            self._stop.wait(timing.period)
