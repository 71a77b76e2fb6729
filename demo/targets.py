"""The cluster a demo or an end-to-end run drives, and the three things that differ between
clusters: how to reach it, how to read and write the files on a claim, and how to kill a
container's process the way a crash would (the pod stays, the process dies).

    target = from_environment()          # E2E_TARGET=local (default) or kind
    target.write_file("pp-demo", "data", "wordcount/inputs/a.csv", "word\\napple\\n")
    target.kill_container("pp-demo", "wordcount-driver", "driver")

On the local cluster (localcluster/), a claim is the host folder
.cache/cluster/pv/<namespace>/<claim> and a container is a local process whose pid the
node agent records. On kind, files go through a small pod that mounts the claim, and the
process is killed from the node container (`docker exec`), where SIGKILL reaches it (from
inside the container it could not: a namespace's init ignores SIGKILL).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from abc import ABC, abstractmethod
from pathlib import Path

from localcluster.kubectl import HELM_TIMEOUT, KUBECTL_TIMEOUT, KubeCommands

ROOT = Path(__file__).resolve().parents[1]
LOCAL_VALUES = ROOT / "demo" / "values-localcluster.yaml"


class Target(ABC):
    """A Kubernetes cluster with the project's images available."""

    name: str
    kubeconfig: Path
    commands: KubeCommands
    """kubectl and helm against this cluster."""

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = KUBECTL_TIMEOUT) -> str:
        return self.commands.kubectl(*args, stdin=stdin, check=check, timeout=timeout)

    def helm(self, *args: str, timeout: float = HELM_TIMEOUT) -> str:
        return self.commands.helm(*args, timeout=timeout)

    def helm_values(self) -> list[str]:
        """Chart values this cluster needs (helm arguments)."""
        return []

    def create_namespace(self, name: str) -> None:
        """A new namespace that enforces Pod Security "restricted": the API server refuses
        any pod in it that does not meet it, whoever creates it (the operator, Spark)."""
        namespace = {"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
        self.kubectl("create", "-f", "-", stdin=json.dumps(namespace))

    def s3_endpoint(self) -> str | None:
        """An S3 server the cluster's pods can reach, if it has one."""
        return None

    @abstractmethod
    def write_file(self, namespace: str, claim: str, relative: str, content: str) -> None:
        """Adds a file to a claim atomically (written aside, then renamed in)."""

    @abstractmethod
    def read_file(self, namespace: str, claim: str, relative: str) -> str | None:
        """A file of a claim, or None when it does not exist."""

    @abstractmethod
    def kill_container(self, namespace: str, pod: str, container: str) -> str:
        """SIGKILL to a running container's main process; returns what was killed, in words."""

    def forget_claims(self, namespace: str) -> None:
        """Removes what a deleted namespace's claims left behind, where the cluster keeps it."""


class LocalTarget(Target):
    """The repository's local control plane (localcluster/), started if needed."""

    name = "local"

    def __init__(self) -> None:
        from localcluster import Cluster
        from localcluster.layout import Layout

        self.layout = Layout.for_repo()
        self.cluster = Cluster(self.layout, out=lambda _: None)
        self.kubeconfig = self.layout.kubeconfig
        self.commands = KubeCommands.for_repo(self.kubeconfig, self.layout)
        self.started_here = False

    def start(self) -> None:
        self.started_here = not self.cluster.is_up()
        self.cluster.ensure_up()

    def stop(self) -> None:
        self.cluster.down()

    def helm_values(self) -> list[str]:
        return ["-f", str(LOCAL_VALUES)]

    def s3_endpoint(self) -> str | None:
        return self.cluster.info().s3_endpoint

    def claim_folder(self, namespace: str, claim: str) -> Path:
        return self.layout.pv_dir / namespace / claim

    def write_file(self, namespace: str, claim: str, relative: str, content: str) -> None:
        path = self.claim_folder(namespace, claim) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.tmp")
        partial.write_text(content)
        partial.rename(path)

    def read_file(self, namespace: str, claim: str, relative: str) -> str | None:
        path = self.claim_folder(namespace, claim) / relative
        return path.read_text() if path.exists() else None

    def kill_container(self, namespace: str, pod: str, container: str) -> str:
        from localcluster.testing import kill_container

        pid = kill_container(self.cluster.info(), namespace, pod, container, layout=self.layout)
        return f"kill -9 {pid} (the {container} container's process of pod {pod})"

    def forget_claims(self, namespace: str) -> None:
        shutil.rmtree(self.layout.pv_dir / namespace, ignore_errors=True)


class KindTarget(Target):
    """A kind cluster (make e2e-kind) whose node has the project's images loaded."""

    name = "kind"
    FILES_POD = "claim-files"

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.commands = KubeCommands.for_repo(kubeconfig)

    def _files_pod(self, namespace: str, claim: str) -> str:
        """A pod mounting the claim at /claim, created on first use."""
        name = f"{self.FILES_POD}-{claim}"
        if not self.kubectl("get", "pod", "-n", namespace, name, "--ignore-not-found", "-o", "name"):
            manifest = f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsUser: 185, runAsGroup: 185, fsGroup: 185}}
  containers:
    - name: files
      image: busybox:1.36
      command: [sh, -c, "trap 'exit 0' TERM; while true; do sleep 1; done"]
      volumeMounts: [{{name: claim, mountPath: /claim}}]
  volumes: [{{name: claim, persistentVolumeClaim: {{claimName: {claim}}}}}]
"""
            self.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)
            self.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"pod/{name}", "--timeout=180s")
        return name

    def write_file(self, namespace: str, claim: str, relative: str, content: str) -> None:
        path = f"/claim/{relative}"
        folder, base = path.rsplit("/", 1)
        script = f"mkdir -p {shlex.quote(folder)} && cat > {shlex.quote(f'{folder}/.{base}.tmp')} && " \
                 f"mv {shlex.quote(f'{folder}/.{base}.tmp')} {shlex.quote(path)}"
        self.kubectl("exec", "-i", "-n", namespace, self._files_pod(namespace, claim), "--", "sh", "-c", script,
                     stdin=content)

    def read_file(self, namespace: str, claim: str, relative: str) -> str | None:
        path = shlex.quote(f"/claim/{relative}")
        out = self.kubectl("exec", "-n", namespace, self._files_pod(namespace, claim), "--", "sh", "-c",
                           f"if [ -f {path} ]; then echo present; cat {path}; else echo absent; fi")
        status, _, content = out.partition("\n")
        return content if status == "present" else None

    def kill_container(self, namespace: str, pod: str, container: str) -> str:
        node = self.kubectl("get", "pod", "-n", namespace, pod, "-o", "jsonpath={.spec.nodeName}").strip()
        status = self.kubectl("get", "pod", "-n", namespace, pod, "-o",
                              f"jsonpath={{.status.containerStatuses[?(@.name=='{container}')].containerID}}")
        container_id = status.strip().split("://", 1)[-1]
        if not container_id:
            raise RuntimeError(f"container {container} of pod {namespace}/{pod} is not running")
        # From the node (the pod's parent PID namespace), where SIGKILL reaches the process.
        script = f'kill -9 "$(crictl inspect --output go-template --template "{{{{.info.pid}}}}" {container_id})"'
        subprocess.run(["docker", "exec", node, "sh", "-c", script], check=True, capture_output=True, timeout=60)
        return f"kill -9 of the {container} container's process on node {node}"


def from_environment() -> Target:
    """E2E_TARGET=local (default): the repository's local cluster; E2E_TARGET=kind: the
    cluster of E2E_KUBECONFIG (make e2e-kind sets both)."""
    kind = os.environ.get("E2E_TARGET", "local")
    if kind == "local":
        return LocalTarget()
    if kind == "kind":
        return KindTarget(Path(os.environ["E2E_KUBECONFIG"]))
    raise ValueError(f"E2E_TARGET={kind!r}: expected local or kind")
