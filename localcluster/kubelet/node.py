"""The Node object and its Lease, built by pure functions from a few host facts."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster.kubelet.status import HOST_IP, rfc3339

JsonDict = dict[str, Any]
KUBELET_VERSION = "v1.37.1"
RUNTIME_VERSION = "localcluster://0.1.0"
LEASE_DURATION_SECONDS = 40
LEASE_NAMESPACE = "kube-node-lease"
MAX_PODS = 110


@dataclass(frozen=True)
class HostFacts:
    cpus: int
    memory_kib: int
    kernel: str
    os_image: str
    architecture: str
    machine_id: str
    boot_id: str


def host_facts() -> HostFacts:
    meminfo = Path("/proc/meminfo").read_text().split("\n")[0].split()
    return HostFacts(
        cpus=os.cpu_count() or 1,
        memory_kib=int(meminfo[1]),
        kernel=platform.release(),
        os_image=_os_image(),
        architecture={"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine()),
        machine_id=_read("/etc/machine-id"),
        boot_id=_read("/proc/sys/kernel/random/boot_id"),
    )


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return "Linux"


def node_conditions(now: float, since: float) -> list[JsonDict]:
    healthy = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "localcluster node agent is posting ready status"),
    ]
    return [
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": rfc3339(now),
            "lastTransitionTime": rfc3339(since),
        }
        for kind, status, reason, message in healthy
    ]


def node_status(facts: HostFacts, kubelet_port: int, now: float, since: float) -> JsonDict:
    resources = {
        "cpu": str(facts.cpus),
        "memory": f"{facts.memory_kib}Ki",
        "pods": str(MAX_PODS),
        "ephemeral-storage": "100Gi",
    }
    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": node_conditions(now, since),
        "addresses": [
            {"type": "InternalIP", "address": HOST_IP},
            {"type": "Hostname", "address": "localhost"},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "machineID": facts.machine_id,
            "systemUUID": facts.machine_id,
            "bootID": facts.boot_id,
            "kernelVersion": facts.kernel,
            "osImage": facts.os_image,
            "containerRuntimeVersion": RUNTIME_VERSION,
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": facts.architecture,
        },
    }


def node_object(name: str, facts: HostFacts, kubelet_port: int, now: float) -> JsonDict:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": facts.architecture,
        "node-role.kubernetes.io/control-plane": "",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": node_status(facts, kubelet_port, now, now),
    }


def lease_object(node_name: str, node_uid: str, now: float) -> JsonDict:
    """The heartbeat the node lifecycle controller reads (kube-node-lease/<node>)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node_name,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}],
        },
        "spec": {
            "holderIdentity": node_name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": micro_time(now),
        },
    }


def micro_time(timestamp: float) -> str:
    """metav1.MicroTime, which Lease.renewTime requires."""
    seconds = int(timestamp)
    micros = int((timestamp - seconds) * 1_000_000)
    return rfc3339(seconds)[:-1] + f".{micros:06d}Z"
