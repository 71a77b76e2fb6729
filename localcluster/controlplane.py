"""Pure builders: the command lines of the control-plane processes and the kubeconfigs.

Everything listens on 127.0.0.1 only. Tests call these functions directly; `cluster.py`
runs what they return.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from localcluster.layout import LOOPBACK, NODE_NAME, SERVICE_ACCOUNT_ISSUER, SERVICE_CIDR, Layout
from localcluster.pki import Pki

# Start order; `down` stops them in reverse, so the node agent goes first and can still
# reach the apiserver while it stops its pods.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "s3", "node-agent")

# Port names each component listens on.
PORT_NAMES = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "s3", "node-agent")

# Controllers that need a cloud or a pod network to do anything useful. The endpoint
# controllers would publish each selected pod's IP, 127.0.0.1, which the API refuses
# ("may not be in the loopback range"), so every Service of a running pod collected
# FailedToUpdateEndpointSlices warnings; without kube-proxy or DNS nothing reads them.
DISABLED_CONTROLLERS = ("node-ipam-controller", "endpoints-controller", "endpointslice-controller")


@dataclass(frozen=True)
class Ports:
    """The loopback ports chosen at `up` and recorded in state.json."""

    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    s3: int
    node_agent: int

    def as_dict(self) -> dict[str, int]:
        return dict(zip(PORT_NAMES, self._values(), strict=True))

    def _values(self) -> tuple[int, ...]:
        return (self.etcd, self.etcd_peer, self.apiserver, self.controller_manager, self.s3, self.node_agent)

    @classmethod
    def from_dict(cls, ports: Mapping[str, int]) -> Ports:
        return cls(*(int(ports[name]) for name in PORT_NAMES))


def choose_ports(
    previous: Mapping[str, int], is_free: Callable[[int], bool], fresh: Callable[[], int]
) -> Ports:
    """Keeps last run's ports where they are still free (kubeconfigs stay valid), else picks new ones."""
    chosen: dict[str, int] = {}
    for name in PORT_NAMES:
        port = previous.get(name)
        if port is None or port in chosen.values() or not is_free(port):
            port = fresh()
            while port in chosen.values():
                port = fresh()
        chosen[name] = port
    return Ports.from_dict(chosen)


def apiserver_url(ports: Ports) -> str:
    return f"https://{LOOPBACK}:{ports.apiserver}"


def s3_endpoint(ports: Ports) -> str:
    return f"http://{LOOPBACK}:{ports.s3}"


def etcd_command(layout: Layout, ports: Ports) -> list[str]:
    client = f"http://{LOOPBACK}:{ports.etcd}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return [
        str(layout.binary("etcd")),
        "--name=localcluster",
        f"--data-dir={layout.etcd_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=localcluster={peer}",
        "--log-level=warn",
        # A throw-away test cluster on a shared disk: durability against power loss is not
        # worth an fsync on every write, which makes each pod status update slower.
        "--unsafe-no-fsync",
        "--quota-backend-bytes=2147483648",
    ]


def apiserver_command(layout: Layout, ports: Ports) -> list[str]:
    pki = Pki(layout.pki_dir)
    return [
        str(layout.binary("kube-apiserver")),
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.cert('apiserver')}",
        f"--tls-private-key-file={pki.key('apiserver')}",
        f"--client-ca-file={pki.ca_cert}",
        f"--token-auth-file={pki.token_file}",
        "--authorization-mode=Node,RBAC",
        "--anonymous-auth=false",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Endpoints for the `kubernetes` Service would point at 127.0.0.1, which the
        # apiserver rejects as an endpoint address; pods reach it by KUBERNETES_SERVICE_HOST.
        "--endpoint-reconciler-type=none",
        f"--kubelet-client-certificate={pki.cert('apiserver-kubelet-client')}",
        f"--kubelet-client-key={pki.key('apiserver-kubelet-client')}",
        f"--kubelet-certificate-authority={pki.ca_cert}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_command(layout: Layout, ports: Ports) -> list[str]:
    pki = Pki(layout.pki_dir)
    kubeconfig = layout.component_kubeconfig("kube-controller-manager")
    return [
        str(layout.binary("kube-controller-manager")),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        # No front proxy here: do not look up its request-header CA (it would only log errors).
        "--authentication-skip-lookup=true",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.controller_manager}",
        f"--tls-cert-file={pki.cert('controller-manager')}",
        f"--tls-private-key-file={pki.key('controller-manager')}",
        "--use-service-account-credentials=true",
        f"--root-ca-file={pki.ca_cert}",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        "--controllers=*," + ",".join(f"-{c}" for c in DISABLED_CONTROLLERS),
        # One instance: waiting for a leader lease only slows the start down.
        "--leader-elect=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--profiling=false",
        "--v=1",
    ]


def s3_command(layout: Layout, ports: Ports) -> list[str]:
    return [str(layout.venv / "bin" / "moto_server"), "-H", LOOPBACK, "-p", str(ports.s3)]


def node_agent_command(layout: Layout, ports: Ports) -> list[str]:
    return [
        str(layout.python),
        "-m",
        "localcluster.node_agent",
        f"--repo={layout.repo}",
        f"--venv={layout.venv}",
        f"--port={ports.node_agent}",
        f"--node-name={NODE_NAME}",
    ]


def command_for(component: str, layout: Layout, ports: Ports) -> list[str]:
    builders: dict[str, Callable[[Layout, Ports], list[str]]] = {
        "etcd": etcd_command,
        "kube-apiserver": apiserver_command,
        "kube-controller-manager": controller_manager_command,
        "s3": s3_command,
        "node-agent": node_agent_command,
    }
    return builders[component](layout, ports)


def kubeconfig(
    server: str, ca_pem: bytes, user: str, token: str, context: str = "localcluster"
) -> dict[str, Any]:
    """A token kubeconfig with the CA inline, so a copy of the file works anywhere."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": context,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {"name": context, "context": {"cluster": context, "user": user, "namespace": "default"}}
        ],
        "current-context": context,
    }
