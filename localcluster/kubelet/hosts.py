"""Each pod's /etc/hosts: the local cluster's stand-in for cluster DNS. Pure, except
`write_in_place`.

Kubelet writes every pod a hosts file of its own (pods/<uid>/etc-hosts) and bind-mounts it at
/etc/hosts. The local cluster has no DNS server, but every pod listens on the host's loopback,
so the one answer cluster DNS could give for a Service is 127.0.0.1: the file maps each
Service's names to it, as a pod's resolver (its search path included) would find them:

    kafka                                (a Service of the pod's own namespace)
    kafka.NS  kafka.NS.svc  kafka.NS.svc.cluster.local

It starts with the host's own /etc/hosts (processes here run on the host's network and its
names must keep resolving), then the pod's hostname and `spec.hostAliases`, as kubelet's.
The node agent rewrites the file when Services come and go; ExternalName Services are left
out (DNS answers them with another name, which a hosts file cannot say).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

JsonDict = dict[str, Any]
ServiceKey = tuple[str, str]
"""(namespace, name) of a Service."""

CLUSTER_DOMAIN = "cluster.local"
POD_ADDRESS = "127.0.0.1"
HOSTS_PATH = "/etc/hosts"


def service_key(service: JsonDict) -> ServiceKey | None:
    """The Service's key, or None for one that DNS would not answer with an address."""
    if (service.get("spec") or {}).get("type") == "ExternalName":
        return None
    meta = service["metadata"]
    return meta["namespace"], meta["name"]


def service_names(key: ServiceKey, pod_namespace: str) -> list[str]:
    namespace, name = key
    qualified = [f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}"]
    return [name, *qualified] if namespace == pod_namespace else qualified


def hosts_file(pod: JsonDict, host_hosts: str, services: Iterable[ServiceKey]) -> str:
    """The content of the pod's /etc/hosts."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    lines = ["# Kubernetes-managed hosts file (the local cluster's node agent).", host_hosts.rstrip("\n")]
    lines.append(f"{POD_ADDRESS}\t{spec.get('hostname') or meta['name']}")
    for alias in spec.get("hostAliases") or ():
        lines.append(f"{alias['ip']}\t{' '.join(alias.get('hostnames') or ())}")
    lines.append("# Services (no DNS here: every pod listens on the host's loopback).")
    for key in sorted(services):
        lines.append(f"{POD_ADDRESS}\t{' '.join(service_names(key, meta['namespace']))}")
    return "\n".join(lines) + "\n"


def write_in_place(path: Path, content: str) -> None:
    """Writes the file keeping its inode: a container's bind mount of it sees the new content,
    where a rename would leave the container on the old file."""
    data = content.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        # Write, then cut: a reader between the two sees the new lines and a stale tail,
        # never an empty file.
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
