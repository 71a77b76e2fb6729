"""Helpers of the operator's tests on the local cluster: a test namespace, the operator
as a child process, the word count pipeline, and checks of its output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client, utils

from localcluster import ClusterInfo
from localcluster.kubectl import KubeCommands
from localcluster.procs import free_port
from localcluster.testing import wait_for

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "crds"
PV_ROOT = ROOT / ".cache" / "cluster" / "pv"
GROUP, VERSION, PLURAL = "sparkapp.dev", "v1alpha1", "persistentpipelines"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}

DRIVER_RBAC: list[dict[str, Any]] = [
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "spark-app-driver"}},
    # The driver reports its progress on its own pod (spark_app.runtime.reporting).
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "spark-app-driver"},
     "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "spark-app-driver"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "spark-app-driver"},
     "subjects": [{"kind": "ServiceAccount", "name": "spark-app-driver"}]},
]


def claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}




class Namespace:
    """A test's namespace, with the helpers the tests share."""

    def __init__(self, name: str, cluster: ClusterInfo, api: client.ApiClient) -> None:
        self.name = name
        self.cluster = cluster
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.commands = KubeCommands.for_repo(cluster.kubeconfig)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """kubectl against the cluster, in this namespace."""
        return self.commands.kubectl("-n", self.name, *args, stdin=stdin, check=check)

    def apply(self, *manifests: dict[str, Any]) -> None:
        """Creates the objects, or replaces a PersistentPipeline's spec if it exists."""
        for manifest in manifests:
            if manifest["kind"] == "PersistentPipeline":
                name = manifest["metadata"]["name"]
                current = self.pipeline(name)
                if current is None:
                    self.custom.create_namespaced_custom_object(GROUP, VERSION, self.name, PLURAL, manifest)
                else:
                    self.custom.replace_namespaced_custom_object(GROUP, VERSION, self.name, PLURAL, name,
                                                                 {**current, "spec": manifest["spec"]})
            else:
                utils.create_from_dict(self.core.api_client, manifest, namespace=self.name)

    def folder(self, claim_name: str) -> Path:
        """The host folder behind a claim (the local node agent maps claims to folders)."""
        path = PV_ROOT / self.name / claim_name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def s3_bucket_and_secret(self) -> tuple[Any, dict[str, Any]]:
        """A bucket of the cluster's S3 server for this namespace, and the Secret ``s3-creds``
        holding the server's credentials: returns an S3 client and the ``spec.persistence.s3``
        that names both (credentials by reference only)."""
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.cluster.s3_endpoint, region_name="us-east-1",
                          aws_access_key_id="localcluster", aws_secret_access_key="localcluster-secret")
        bucket = f"ppl-{self.name[-5:]}"
        s3.create_bucket(Bucket=bucket)
        self.core.create_namespaced_secret(self.name, client.V1Secret(
            metadata=client.V1ObjectMeta(name="s3-creds"),
            string_data={"AWS_ACCESS_KEY_ID": "localcluster", "AWS_SECRET_ACCESS_KEY": "localcluster-secret"}))
        return s3, {"bucket": bucket, "endpoint": self.cluster.s3_endpoint, "region": "us-east-1",
                    "credentialsSecret": {"name": "s3-creds"}}

    def pipeline(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.name, PLURAL, name)
            return found
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def status(self, name: str) -> dict[str, Any]:
        return (self.pipeline(name) or {}).get("status") or {}

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.name, PLURAL, name, {"spec": spec})

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.name, PLURAL, name)

    def pod(self, name: str) -> client.V1Pod | None:
        try:
            return self.core.read_namespaced_pod(name, self.name)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def driver(self, pipeline: str, *, epoch: int | None = None, running: bool = True) -> client.V1Pod | None:
        """The driver pod if it exists (with that epoch, and running), else None."""
        pod = self.pod(f"{pipeline}-driver")
        if pod is None or pod.metadata.deletion_timestamp:
            return None
        if epoch is not None and pod.metadata.annotations.get("sparkapp.dev/epoch") != str(epoch):
            return None
        if running and not (pod.status.phase == "Running" and pod.status.container_statuses
                            and pod.status.container_statuses[0].state.running):
            return None
        return pod

    def events(self, pipeline: str) -> list[tuple[str, str, str]]:
        """(type, reason, message) of the Events about the pipeline, oldest first."""
        found = self.core.list_namespaced_event(self.name, field_selector=f"involvedObject.name={pipeline},"
                                                                          "involvedObject.kind=PersistentPipeline")
        items = sorted(found.items, key=lambda e: (e.last_timestamp or e.event_time or e.metadata.creation_timestamp))
        return [(e.type, e.reason, e.message) for e in items]

    def event_reasons(self, pipeline: str) -> list[str]:
        return [reason for _, reason, _ in self.events(pipeline)]

    def announced(self, pipeline: str, *reasons: str, timeout: float = 30) -> list[str]:
        """The Event reasons once they include ``reasons``. The operator posts a pass's Events
        after it has recorded its status (or released its finalizer): what the status shows
        can be seen a moment before them (a cold run read the Events in between)."""
        return eventually(f"the events {', '.join(reasons)} of {pipeline}",
                          lambda: set(reasons) <= set(found := self.event_reasons(pipeline)) and found, timeout)

    def kill_driver(self, pipeline: str) -> int:
        """SIGKILL to the driver's main process (the local node agent runs containers as processes)."""
        pod = self.driver(pipeline)
        assert pod is not None, "no running driver to kill"
        pid = int(pod.status.container_statuses[0].container_id.removeprefix("localcluster://"))
        os.kill(pid, signal.SIGKILL)
        return pid



class Operator:
    """``python -m pipeline_operator`` as a child process, stopped by its pid."""

    def __init__(self, cluster: ClusterInfo, namespace: str, log_dir: Path, *extra: str) -> None:
        self.cluster, self.namespace, self.extra = cluster, namespace, extra
        self.log_dir = log_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.metrics_port = free_port()

    def start(self) -> None:
        self.starts += 1
        self.liveness_port = free_port()
        log = open(self.log_dir / f"operator-{self.starts}.log", "wb")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pipeline_operator", f"--kubeconfig={self.cluster.kubeconfig}",
             f"--namespace={self.namespace}", f"--liveness-port={self.liveness_port}",
             f"--metrics-port={self.metrics_port}", "--log-format=full", "--poll-seconds=1",
             "--recheck-seconds=3", *self.extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        )
        log.close()
        wait_for("the operator's liveness endpoint", self._started, timeout=30)

    def _started(self) -> bool:
        """Whether it serves its liveness endpoint; an operator that exited instead fails
        the wait at once, with its exit code and the end of its log."""
        assert self.process is not None
        code = self.process.poll()
        if code is not None:
            raise AssertionError(f"the operator exited with code {code} before serving its liveness endpoint "
                                 f"on port {self.liveness_port}; the end of its log:\n{self.log()[-3000:]}")
        return self.alive()

    def alive(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("operator-*.log")))



def wordcount(name: str = "wordcount", **spec: Any) -> dict[str, Any]:
    """The word count example on the ``state`` claim, reading and writing on the ``data`` claim."""
    body: dict[str, Any] = {
        "application": {"file": "examples/wordcount.py",
                        "args": ["--input", "/data/inputs", "--output", "/data/result.jsonlines",
                                 "--trigger-interval-ms", "500"]},
        "driver": {
            "serviceAccountName": "spark-app-driver",
            "terminationGracePeriodSeconds": 40,
            "podTemplate": {"spec": {
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                "containers": [{"name": "driver", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            }},
        },
        "persistence": {"snapshotIntervalSeconds": 5, "filesystem": {"claimName": "state"}},
        "restartPolicy": {"backoff": {"initialSeconds": 3, "maxSeconds": 60}},
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PersistentPipeline", "metadata": {"name": name},
            "spec": body}


def write_words(folder: Path, name: str, words: list[str]) -> None:
    """Adds an input file atomically (written aside, then renamed in)."""
    inputs = folder / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    partial = inputs / f".{name}.tmp"
    partial.write_text("word\n" + "".join(f"{w}\n" for w in words))
    partial.rename(inputs / name)


def replay(changelog: Path) -> dict[str, int]:
    """Applies the output changelog (+1 adds a row, -1 removes it) and checks it is
    consistent: a row is removed only if present, added only if its key is absent. A
    duplicated or lost batch breaks one of the two."""
    table: dict[str, int] = {}
    if not changelog.exists():
        return table
    for line in changelog.read_text().splitlines():
        row = json.loads(line)
        word, count, diff = row["word"], row["count"], row["diff"]
        if diff == -1:
            assert table.get(word) == count, f"removes {word}={count} but the table has {table.get(word)}"
            del table[word]
        else:
            assert word not in table, f"adds {word}={count} while {word}={table[word]} is present (a duplicate)"
            table[word] = count
    return table


def eventually(what: str, probe: Any, timeout: float = 240.0, every: float = 0.5) -> Any:
    """wait_for with the timeouts Spark needs on a small machine."""
    return wait_for(what, probe, timeout=timeout, every=every)


def now() -> float:
    return time.monotonic()
