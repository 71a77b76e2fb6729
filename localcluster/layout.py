"""Where the local cluster keeps its binaries, certificates, data and logs.

Everything lives under `<repo>/.cache/`: `bin/` holds the control-plane binaries that
`make bins` links there, `cluster/` the run state. Deleting `cluster/` (make cluster-clean)
resets the cluster; the PKI is regenerated on the next `up`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

NODE_NAME = "local-node"
SERVICE_CIDR = "10.96.0.0/16"
# The first address of SERVICE_CIDR: the apiserver gives it to the `kubernetes` Service.
KUBERNETES_SERVICE_IP = "10.96.0.1"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Layout:
    """Paths of one local cluster. Pure: building it touches nothing on disk."""

    repo: Path
    """The repository root (the folder holding `localcluster/`)."""
    venv: Path
    """The virtualenv whose python runs the node agent, moto and `python` images."""

    @classmethod
    def for_repo(cls, repo: Path | None = None, venv: Path | None = None) -> Layout:
        root = (repo or Path(__file__).resolve().parent.parent).resolve()
        # sys.prefix is the venv when we run from it; fall back to the repo's .venv.
        default_venv = Path(sys.prefix) if sys.prefix != sys.base_prefix else root / ".venv"
        return cls(repo=root, venv=(venv or default_venv).absolute())

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def bin_dir(self) -> Path:
        return self.repo / ".cache" / "bin"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def cluster_dir(self) -> Path:
        return self.repo / ".cache" / "cluster"

    @property
    def pki_dir(self) -> Path:
        return self.cluster_dir / "pki"

    @property
    def etcd_dir(self) -> Path:
        return self.cluster_dir / "etcd"

    @property
    def logs_dir(self) -> Path:
        return self.cluster_dir / "logs"

    @property
    def pod_logs_dir(self) -> Path:
        return self.logs_dir / "pods"

    @property
    def pods_dir(self) -> Path:
        return self.cluster_dir / "pods"

    @property
    def pv_dir(self) -> Path:
        return self.cluster_dir / "pv"

    @property
    def state_file(self) -> Path:
        return self.cluster_dir / "state.json"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig for kubectl, helm and the Python client."""
        return self.cluster_dir / "kubeconfig"

    def component_kubeconfig(self, component: str) -> Path:
        return self.cluster_dir / f"{component}.kubeconfig"

    def log_file(self, component: str) -> Path:
        return self.logs_dir / f"{component}.log"

    @property
    def images_file(self) -> Path:
        return self.repo / "localcluster" / "images.yaml"
