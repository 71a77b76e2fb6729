"""Bringing the local control plane up and down: the impure side of controlplane.py.

State (ports and process records) lives in `.cache/cluster/state.json`, written after each
process starts, so that `down` can stop whatever a failed `up` left running.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
import yaml

from localcluster import controlplane, procs
from localcluster.controlplane import COMPONENTS, Ports
from localcluster.kubeapi import ApiConfig, ApiError, KubeApi
from localcluster.kubelet.runtime import kill_leftovers
from localcluster.layout import LOOPBACK, NODE_NAME, Layout
from localcluster.pki import Pki, ensure_pki

REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")

# How long each component may take to become healthy on a busy 2-core machine.
READY_TIMEOUTS = {
    "etcd": 30.0,
    "kube-apiserver": 90.0,
    "kube-controller-manager": 60.0,
    "s3": 30.0,
    "node-agent": 60.0,
}
# How long `down` waits after SIGTERM before SIGKILL; the node agent stops its pods first.
STOP_GRACE = {"node-agent": 60.0}
DEFAULT_STOP_GRACE = 15.0

# Any credentials work with the local S3 server; these are what `env` exports.
S3_ACCESS_KEY = "localcluster"
S3_SECRET_KEY = "localcluster-secret"
S3_REGION = "us-east-1"


class ClusterError(Exception):
    """Something the user has to fix; the message says what."""


@dataclass(frozen=True)
class ClusterInfo:
    """What a client of the running cluster needs."""

    kubeconfig: Path
    apiserver_url: str
    s3_endpoint: str
    node_name: str
    ports: Ports

    def env(self) -> dict[str, str]:
        """Environment for kubectl, helm, boto3 and the Python client against this cluster."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "AWS_ENDPOINT_URL_S3": self.s3_endpoint,
            "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
            "AWS_DEFAULT_REGION": S3_REGION,
        }


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    alive: bool
    healthy: bool
    port: int | None


@dataclass(frozen=True)
class State:
    """The content of state.json."""

    ports: dict[str, int]
    processes: dict[str, procs.ProcessRecord]

    def to_json(self) -> dict[str, Any]:
        return {"ports": self.ports, "processes": {k: v.to_json() for k, v in self.processes.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> State:
        records = {k: procs.ProcessRecord.from_json(v) for k, v in data.get("processes", {}).items()}
        return cls(ports=dict(data.get("ports", {})), processes=records)


def component_port(name: str, ports: Ports) -> int:
    return ports.as_dict()[name]


def component_ports(name: str, ports: Ports) -> list[int]:
    """Every port a component listens on."""
    return [ports.etcd, ports.etcd_peer] if name == "etcd" else [component_port(name, ports)]


class Cluster:
    """The local control plane of this repository."""

    def __init__(self, layout: Layout | None = None, out: Callable[[str], None] = print) -> None:
        self.layout = layout or Layout.for_repo()
        self._out = out

    # ---- public API -------------------------------------------------------------------

    def ensure_up(self) -> ClusterInfo:
        """Starts whatever is not running and healthy; returns fast if everything is."""
        with self._lock():
            state = self._load_state()
            if state is not None and self._all_healthy(state):
                self._out(f"local cluster already up: {controlplane.apiserver_url(self._ports(state))}")
                return self._info(state)
            check_prerequisites(self.layout)
            if state is not None and self._repairable(state):
                return self._repair(state)
            if state is not None:
                self._stop_all(state, reason="leftover of a previous run")
            return self._start_all(state)

    def down(self) -> None:
        """Stops exactly the processes recorded by `up`, node agent first. Keeps the data."""
        with self._lock():
            state = self._load_state()
            if state is None or not state.processes:
                self._out("local cluster is not running")
                return
            self._stop_all(state, reason="down")

    def is_up(self) -> bool:
        state = self._load_state()
        return state is not None and self._all_healthy(state)

    def info(self) -> ClusterInfo:
        state = self._load_state()
        if state is None or not state.ports:
            raise ClusterError("the local cluster has never been started: run `make cluster-up`")
        return self._info(state)

    def status(self) -> list[ComponentStatus]:
        state = self._load_state() or State(ports={}, processes={})
        result = []
        for name in COMPONENTS:
            record = state.processes.get(name)
            alive = record is not None and procs.is_alive(record)
            healthy = alive and state.ports != {} and self._ready(name, self._ports(state))
            port = state.ports.get(name)
            result.append(ComponentStatus(name, record.pid if record else None, alive, healthy, port))
        return result

    # ---- starting ---------------------------------------------------------------------

    def _start_all(self, previous: State | None) -> ClusterInfo:
        started = time.monotonic()
        for folder in (self.layout.logs_dir, self.layout.pv_dir, self.layout.pods_dir, self.layout.etcd_dir):
            folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.layout.etcd_dir, 0o700)
        if ensure_pki(Pki(self.layout.pki_dir)):
            self._out(f">>> generated a CA, certificates and tokens in {self.layout.pki_dir}")
        ports = controlplane.choose_ports(
            previous.ports if previous else {}, procs.port_is_free, procs.free_port
        )
        state = State(ports=ports.as_dict(), processes={})
        self._save_state(state)
        self._write_kubeconfigs(ports)
        for name in COMPONENTS:
            self._start_component(name, ports, state)
        self._out(
            f">>> local cluster up in {time.monotonic() - started:.1f}s; kubeconfig: {self.layout.kubeconfig}"
        )
        return self._info(state)

    def _broken(self, state: State) -> list[str]:
        ports = self._ports(state)
        return [
            name
            for name in COMPONENTS
            if name not in state.processes
            or not procs.is_alive(state.processes[name])
            or not self._healthy(name, ports)
        ]

    def _repairable(self, state: State) -> bool:
        """Some components still run: restart only the others, on their recorded ports,
        rather than stop everything (restarting the node agent restarts every pod)."""
        if set(state.ports) != set(controlplane.PORT_NAMES):
            return False
        broken = self._broken(state)
        return len(broken) < len(COMPONENTS) and all(
            procs.port_is_free(port) or name in state.processes and procs.is_alive(state.processes[name])
            for name in broken
            for port in component_ports(name, self._ports(state))
        )

    def _repair(self, state: State) -> ClusterInfo:
        ports = self._ports(state)
        for name in self._broken(state):
            record = state.processes.pop(name, None)
            if record is not None and procs.is_alive(record):
                self._out(f">>> stopping {name} (pid {record.pid}, not healthy)")
                procs.stop(record, STOP_GRACE.get(name, DEFAULT_STOP_GRACE))
            self._start_component(name, ports, state)
        self._out(f">>> local cluster repaired; kubeconfig: {self.layout.kubeconfig}")
        return self._info(state)

    def _start_component(self, name: str, ports: Ports, state: State) -> None:
        port = component_port(name, ports)
        self._out(f">>> starting {name} on {LOOPBACK}:{port}")
        began = time.monotonic()
        argv = controlplane.command_for(name, self.layout, ports)
        proc, record = procs.spawn(
            argv, self.layout.log_file(name), env=self._component_env(), cwd=self.layout.repo
        )
        state.processes[name] = record
        self._save_state(state)
        deadline = began + READY_TIMEOUTS[name]
        while not self._ready(name, ports):
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with code {proc.returncode}: {self._log_tail(name)}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{name} not ready after {READY_TIMEOUTS[name]:.0f}s: {self._log_tail(name)}"
                )
            time.sleep(0.1)
        self._out(f"... ready in {time.monotonic() - began:.1f}s")

    def _component_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "AWS_"))}
        # The node agent runs from the repo; make sure it imports this checkout.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.layout.repo), env.get("PYTHONPATH", "")]))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _log_tail(self, name: str, lines: int = 15) -> str:
        try:
            tail = self.layout.log_file(name).read_text(errors="replace").splitlines()[-lines:]
        except FileNotFoundError:
            return "(no log)"
        return f"last lines of {self.layout.log_file(name)}:\n" + "\n".join(tail)

    def _write_kubeconfigs(self, ports: Ports) -> None:
        pki = Pki(self.layout.pki_dir)
        ca_pem = pki.ca_cert.read_bytes()
        server = controlplane.apiserver_url(ports)
        for who, path in (
            ("admin", self.layout.kubeconfig),
            ("kube-controller-manager", self.layout.component_kubeconfig("kube-controller-manager")),
            ("node-agent", self.layout.component_kubeconfig("node-agent")),
        ):
            config = controlplane.kubeconfig(server, ca_pem, f"localcluster-{who}", pki.token(who))
            _write_private(path, yaml.safe_dump(config, sort_keys=False))

    # ---- stopping ---------------------------------------------------------------------

    def _stop_all(self, state: State, reason: str) -> None:
        for name in reversed(COMPONENTS):
            record = state.processes.get(name)
            if record is None:
                continue
            if procs.is_alive(record):
                self._out(f">>> stopping {name} (pid {record.pid}, {reason})")
                began = time.monotonic()
                killed = procs.stop(record, STOP_GRACE.get(name, DEFAULT_STOP_GRACE))
                how = "killed after the grace period" if killed else "stopped"
                self._out(f"... {how} in {time.monotonic() - began:.1f}s")
            del state.processes[name]
            self._save_state(state)
            if name == "node-agent":
                self._kill_orphaned_containers()

    def _kill_orphaned_containers(self) -> None:
        # Only if the agent died or was killed before stopping its pods: their process
        # groups, recorded by pid and start time under pods/.
        killed = kill_leftovers(self.layout.pods_dir)
        if killed:
            self._out(f"... killed {len(killed)} container processes the node agent left behind")

    # ---- health -----------------------------------------------------------------------

    def _all_healthy(self, state: State) -> bool:
        if set(state.processes) != set(COMPONENTS) or not state.ports:
            return False
        if not all(procs.is_alive(r) for r in state.processes.values()):
            return False
        ports = self._ports(state)
        return all(self._ready(name, ports) for name in COMPONENTS)

    def _healthy(self, name: str, ports: Ports) -> bool:
        """The component answers its own health check (whatever the others do)."""
        try:
            return self._health_checks()[name](ports)
        except (urllib3.exceptions.HTTPError, OSError, ApiError, ValueError):
            return False

    def _ready(self, name: str, ports: Ports) -> bool:
        """Healthy, and for the node agent: its Node is Ready in the API."""
        if not self._healthy(name, ports):
            return False
        try:
            return name != "node-agent" or self._node_ready(ports)
        except (urllib3.exceptions.HTTPError, OSError, ApiError, ValueError):
            return False

    def _health_checks(self) -> dict[str, Callable[[Ports], bool]]:
        return {
            "etcd": lambda p: _http_ok(f"http://{LOOPBACK}:{p.etcd}/health", b'"health":"true"'),
            "kube-apiserver": self._apiserver_ready,
            "kube-controller-manager": lambda p: self._tls_ok(
                f"https://{LOOPBACK}:{p.controller_manager}/healthz"
            ),
            "s3": lambda p: _http_ok(controlplane.s3_endpoint(p) + "/"),
            "node-agent": lambda p: self._tls_ok(
                f"https://{LOOPBACK}:{p.node_agent}/healthz", client="apiserver-kubelet-client"
            ),
        }

    def _api(self, ports: Ports) -> KubeApi:
        pki = Pki(self.layout.pki_dir)
        config = ApiConfig(controlplane.apiserver_url(ports), pki.token("admin"), pki.ca_cert.read_bytes())
        return KubeApi(config, pool_size=1, timeout=5.0)

    def _apiserver_ready(self, ports: Ports) -> bool:
        status, _ = self._api(ports).get_text("/readyz")
        return status == 200

    def _node_ready(self, ports: Ports) -> bool:
        node = self._api(ports).get_or_none(f"/api/v1/nodes/{NODE_NAME}")
        conditions = (node or {}).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _tls_ok(self, url: str, client: str | None = None) -> bool:
        pki = Pki(self.layout.pki_dir)
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        if client:
            context.load_cert_chain(pki.cert(client), pki.key(client))
        with urllib3.PoolManager(ssl_context=context, retries=False) as pool:
            return pool.request("GET", url, timeout=2.0).status == 200

    # ---- state ------------------------------------------------------------------------

    def _info(self, state: State) -> ClusterInfo:
        ports = self._ports(state)
        return ClusterInfo(
            kubeconfig=self.layout.kubeconfig,
            apiserver_url=controlplane.apiserver_url(ports),
            s3_endpoint=controlplane.s3_endpoint(ports),
            node_name=NODE_NAME,
            ports=ports,
        )

    @staticmethod
    def _ports(state: State) -> Ports:
        return Ports.from_dict(state.ports)

    def _load_state(self) -> State | None:
        try:
            return State.from_json(json.loads(self.layout.state_file.read_text()))
        except FileNotFoundError:
            return None

    def _save_state(self, state: State) -> None:
        tmp = self.layout.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state.to_json(), indent=2))
        tmp.replace(self.layout.state_file)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        # Two `up`s at once (two terminals, parallel test sessions) must not race on ports.
        self.layout.cluster_dir.mkdir(parents=True, exist_ok=True)
        with open(self.layout.cluster_dir / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


def check_prerequisites(layout: Layout) -> None:
    missing = [b for b in REQUIRED_BINARIES if not os.access(layout.binary(b), os.X_OK)]
    if missing:
        raise ClusterError(f"missing {', '.join(missing)} in {layout.bin_dir}: run `make bins` first")
    version = binary_version(layout.binary("kube-apiserver"))
    if not re.fullmatch(r"v\d+\.\d+\.\d+.*", version):
        # Its metrics registry panics at start without a semantic version stamped in.
        raise ClusterError(
            f"{layout.binary('kube-apiserver')} reports version {version!r}: it was built without "
            "the -X k8s.io/component-base/version.gitVersion=vX.Y.Z link flags and cannot start; "
            "rebuild it with `make bins` once tools/build-go-tools.sh stamps the version"
        )
    if not mount_namespaces_available():
        raise ClusterError(
            "the local cluster runs each container in its own mount namespace, which needs root "
            "(CAP_SYS_ADMIN) and `unshare --mount` to work, and here it does not."
        )


def binary_version(binary: Path) -> str:
    """`kube-apiserver --version` prints "Kubernetes v1.37.1"."""
    try:
        output = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return output.strip().removeprefix("Kubernetes").strip()


def mount_namespaces_available() -> bool:
    try:
        result = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _http_ok(url: str, expect: bytes = b"") -> bool:
    response = urllib3.request("GET", url, timeout=2.0, retries=False)
    return response.status == 200 and expect in response.data


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
