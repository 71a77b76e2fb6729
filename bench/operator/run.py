"""Benchmarks of the operator on the local control plane (make bench-operator).

1. Relaunch latency: the driver process is killed (SIGKILL); how long until the
   replacement pod exists and runs, with the backoff base set to zero. Split into the
   node agent's share (process death -> pod Failed), the operator's share (pod Failed ->
   replacement created, which includes removing the old pod and confirming it gone) and
   the start (created -> running).
2. Scale: 100 PersistentPipelines on one operator: time until all drivers run, the
   operator's CPU and memory while ramping up and at rest, and reconcile latency (from
   its own persistent_pipeline_reconcile_seconds histogram).

The drivers are stand-ins (the spark-app image with a shell command through the pod
template): the figures are the operator's and the control plane's, not Spark's start.
Results go to bench/results/operator-<time>.json, the operator's log to .cache/bench/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import process_cpu_seconds  # noqa: E402
from localcluster import Cluster  # noqa: E402
from localcluster.procs import free_port  # noqa: E402

GROUP, VERSION, PLURAL = "sparkapp.dev", "v1alpha1", "persistentpipelines"
FAKE_DRIVER = ["sh", "-c", "trap 'kill $! 2>/dev/null; exit 0' TERM; sleep 100000 & wait"]


def pipeline(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PersistentPipeline", "metadata": {"name": name},
        "spec": {
            "application": {"file": "examples/wordcount.py"},
            "driver": {"terminationGracePeriodSeconds": 5, "podTemplate": {"spec": {
                "containers": [{"name": "driver", "command": FAKE_DRIVER}]}}},
            "persistence": {"filesystem": {"claimName": "state"}},
            "restartPolicy": {"backoff": {"initialSeconds": 0, "maxSeconds": 0, "jitter": 0}, "maxFailures": 1000},
        },
    }


class PodWatch:
    """Records when this process saw each driver pod appear, fail and run (watch receipt times)."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.seen: dict[str, dict[str, float]] = {}
        self.pipeline_of: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(core, namespace), daemon=True)
        self._thread.start()

    def _run(self, core: client.CoreV1Api, namespace: str) -> None:
        while not self._stop.is_set():
            stream = watch.Watch()
            for change in stream.stream(core.list_namespaced_pod, namespace, timeout_seconds=30,
                                        label_selector="sparkapp.dev/role=driver"):
                now = time.time()
                pod = change["object"]
                marks = self.seen.setdefault(pod.metadata.uid, {})
                self.pipeline_of[pod.metadata.uid] = pod.metadata.labels["sparkapp.dev/pipeline"]
                marks.setdefault("added", now)
                statuses = pod.status.container_statuses or []
                if statuses and statuses[0].state.running:
                    marks.setdefault("running", now)
                if pod.status.phase in ("Failed", "Succeeded"):
                    marks.setdefault("ended", now)
                if change["type"] == "DELETED":
                    marks.setdefault("deleted", now)
                if self._stop.is_set():
                    stream.stop()

    def running(self, pipeline: str, after: float = 0.0) -> dict[str, float] | None:
        for uid, marks in self.seen.items():
            if self.pipeline_of.get(uid) == pipeline and "running" in marks and marks["added"] > after \
                    and "deleted" not in marks and "ended" not in marks:
                return marks
        return None

    def stop(self) -> None:
        self._stop.set()


class OperatorProcess:
    def __init__(self, kubeconfig: Path, namespace: str, log: Path) -> None:
        self.metrics_port, liveness = free_port(), free_port()
        self.log = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pipeline_operator", f"--kubeconfig={kubeconfig}", f"--namespace={namespace}",
             f"--metrics-port={self.metrics_port}", f"--liveness-port={liveness}", "--log-format=full"],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        wait("the operator's metrics endpoint", lambda: self.metrics() is not None, 30)

    def metrics(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
                return str(answer.read().decode())
        except OSError:
            return None

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.process.pid)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/task"))

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def wait(what: str, probe: Any, timeout: float, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"n": len(ordered), "min": round(ordered[0], 3), "median": round(statistics.median(ordered), 3),
            "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3), "max": round(ordered[-1], 3)}


def histogram(text: str, name: str) -> dict[str, float]:
    """A Prometheus histogram's cumulative buckets (by upper bound), with _sum and _count."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket"):
            values[line.split('le="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
        elif line.startswith((f"{name}_sum", f"{name}_count")):
            values[line.split(" ")[0].rsplit("_", 1)[1]] = float(line.rsplit(" ", 1)[1])
    return values


def latency(after: dict[str, float], before: dict[str, float] | None = None) -> dict[str, float]:
    """Mean and p50/p90/p99 (as the upper bound of their bucket) of the observations
    between two scrapes of the histogram."""
    delta = {k: v - (before or {}).get(k, 0.0) for k, v in after.items()}
    count = delta.get("count", 0.0)
    buckets = sorted(((float("inf") if k == "+Inf" else float(k)), v) for k, v in delta.items()
                     if k not in ("sum", "count"))
    result = {"count": count, "mean_ms": round(1000 * delta.get("sum", 0.0) / count, 2) if count else 0.0}
    for q in (0.5, 0.9, 0.99):
        bound = next((b for b, c in buckets if c >= q * count), float("inf"))
        result[f"p{int(q * 100)}_ms_at_most"] = bound * 1000
    return result


def relaunch_latency(core: client.CoreV1Api, custom: client.CustomObjectsApi, namespace: str,
                     pods: PodWatch, trials: int) -> dict[str, Any]:
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pipeline("relaunch"))
    wait("the first driver running", lambda: pods.running("relaunch"), 60)
    detection, operator_share, start, total = [], [], [], []
    for _ in range(trials):
        time.sleep(1.0)
        pod = core.read_namespaced_pod("relaunch-driver", namespace)
        pid = int(pod.status.container_statuses[0].container_id.removeprefix("localcluster://"))
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        old = pods.seen[pod.metadata.uid]
        replacement = wait("the replacement running", lambda k=killed: pods.running("relaunch", after=k), 60)
        wait("the old pod's end seen", lambda o=old: "ended" in o or "deleted" in o, 10)
        ended = old.get("ended", old.get("deleted", killed))
        detection.append(ended - killed)
        operator_share.append(replacement["added"] - ended)
        start.append(replacement["running"] - replacement["added"])
        total.append(replacement["running"] - killed)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "relaunch")
    wait("the relaunch pipeline gone", lambda: not custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL)["items"], 60)
    return {
        "trials": trials,
        "process_death_to_pod_failed_s": summary(detection),
        "operator_pod_failed_to_replacement_created_s": summary(operator_share),
        "replacement_created_to_running_s": summary(start),
        "process_death_to_replacement_running_s": summary(total),
    }


def scale(custom: client.CustomObjectsApi, namespace: str, operator: OperatorProcess, pods: PodWatch,
          count: int, rest_seconds: float) -> dict[str, Any]:
    names = [f"bench-{i:03d}" for i in range(count)]
    cpu0, started = operator.cpu_seconds(), time.time()
    for name in names:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pipeline(name))
    created = time.time()
    wait(f"{count} drivers running", lambda: all(pods.running(n) for n in names), 600, every=0.5)
    all_running = time.time()
    cpu1 = operator.cpu_seconds()
    ramp = {"create_all_s": round(created - started, 2), "all_drivers_running_s": round(all_running - started, 2),
            "operator_cpu_s": round(cpu1 - cpu0, 2),
            "operator_cpu_percent_of_one_core": round(100 * (cpu1 - cpu0) / (all_running - started), 1),
            "operator_rss_mib": round(operator.rss_mib(), 1)}
    time.sleep(5)
    name = "persistent_pipeline_reconcile_seconds"
    ramp_histogram = histogram(operator.metrics() or "", name)
    cpu2, rest_start = operator.cpu_seconds(), time.time()
    rss = []
    while time.time() - rest_start < rest_seconds:
        time.sleep(5)
        rss.append(operator.rss_mib())
    cpu3 = operator.cpu_seconds()
    rest = {"seconds": rest_seconds, "operator_cpu_percent_of_one_core": round(100 * (cpu3 - cpu2) / rest_seconds, 1),
            "operator_rss_mib_max": round(max(rss), 1), "operator_threads": operator.threads()}
    rest_histogram = histogram(operator.metrics() or "", name)
    deleted_at = time.time()
    for name in names:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    wait("every pipeline deleted (graceful stop, finalizer)", lambda: not custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL)["items"], 600, every=1)
    return {"pipelines": count, "ramp_up": ramp, "at_rest": rest,
            "reconcile_latency": {"ramp_up": latency(ramp_histogram),
                                  "at_rest": latency(rest_histogram, ramp_histogram)},
            "delete_all_s": round(time.time() - deleted_at, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--pipelines", type=int, default=100)
    parser.add_argument("--rest-seconds", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    options = parser.parse_args()

    cluster = Cluster()
    started_here = not cluster.is_up()
    info = cluster.ensure_up()
    api = config.new_client_from_config(config_file=str(info.kubeconfig))
    core, custom, extensions = client.CoreV1Api(api), client.CustomObjectsApi(api), client.ApiextensionsV1Api(api)
    for crd in yaml.safe_load_all((ROOT / "crds" / f"{PLURAL}.{GROUP}.yaml").read_text()):
        try:
            extensions.create_custom_resource_definition(crd)
        except client.ApiException as error:
            if error.status != 409:
                raise
    namespace = f"ppl-bench-{uuid.uuid4().hex[:5]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    wait("the default service account", lambda: core.list_namespaced_service_account(namespace).items, 30)
    core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": "state"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    options.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    logs = ROOT / ".cache" / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    operator = OperatorProcess(info.kubeconfig, namespace, logs / f"operator-{stamp}.log")
    pods = PodWatch(core, namespace)
    results: dict[str, Any] = {
        "when": stamp, "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                   "load_average_at_start": os.getloadavg()},
    }
    try:
        results["relaunch"] = relaunch_latency(core, custom, namespace, pods, options.trials)
        print(json.dumps(results["relaunch"], indent=2), flush=True)
        results["scale"] = scale(custom, namespace, operator, pods, options.pipelines, options.rest_seconds)
        print(json.dumps(results["scale"], indent=2), flush=True)
    finally:
        results["machine"]["load_average_at_end"] = os.getloadavg()
        pods.stop()
        operator.stop()
        core.delete_namespace(namespace)
        shutil.rmtree(ROOT / ".cache" / "cluster" / "pv" / namespace, ignore_errors=True)
        if started_here:
            cluster.down()
    path = options.out / f"operator-{stamp}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
