"""`make bench-recovery`: recovery time as a user feels it, under the operator (issue 23).

On the local cluster (the real kube-apiserver, etcd and controller manager, the node agent
that runs pods as local processes), the operator runs the word count example
(tests/integration/operator: ``wordcount``) with ``--keys`` distinct words of state and a
restart backoff of 0. Each round writes a file holding one new word and SIGKILLs the
driver at once, then times until that word's line is in the output. The time is split
along one chain of moments, so that the parts add up to the total:

1. detection: SIGKILL -> the driver pod seen Failed (the node agent);
2. relaunch: pod Failed -> the replacement pod created (the operator) -> its driver
   process started (the node agent);
3. the new driver: its process start -> its first batch done, as its own start-up line
   splits it (spark_app.runtime.startup: the JVM, session and declarations; opening the
   state; restoring the outputs' state; the query's start; the first batch);
4. the first batch done -> the word's output line seen by this process (below zero when
   the line, published inside the batch, was seen before Spark's trigger ended).

Pod moments are when this process's watch received them (bench/operator/run.py's
PodWatch). Results: bench/results/recovery-<time>.json, and a table on stdout. The same
split without the operator (a driver process started by hand) is bench/resume/run.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import SPARK_CONF, progress, write_results  # noqa: E402
from bench.operator.run import OperatorProcess, PodWatch, summary, wait  # noqa: E402
from bench.resume.run import Tail  # noqa: E402
from localcluster import Cluster, ClusterInfo  # noqa: E402
from localcluster.procs import start_ticks  # noqa: E402
from spark_app.runtime.startup import QueryStartup, parse  # noqa: E402
from tests.integration.operator.ppl_cluster import (  # noqa: E402
    CRDS,
    DRIVER_RBAC,
    GROUP,
    PLURAL,
    PV_ROOT,
    RESTRICTED,
    VERSION,
    Namespace,
    claim,
    wordcount,
    write_words,
)

PIPELINE = "recovery"
OUTPUT = "result.jsonlines"  # on the data claim, as wordcount() writes /data/result.jsonlines
GOAL_S = 10.0
"""Issue 23: the next output line at most 10 s after a driver's SIGKILL, at 1M keys."""
SNAPSHOT_INTERVAL_S = 10
HISTORY_FILES = 2
HISTORY_TIMEOUT_S = 1800.0
RELAUNCH_TIMEOUT_S = 180.0
OUTPUT_TIMEOUT_S = 600.0
LOG_LINE_TIMEOUT_S = 60.0

PARTS = {
    "detection_s": "1. SIGKILL → driver pod Failed (node agent)",
    "operator_s": "2a. pod Failed → replacement pod created (operator)",
    "container_start_s": "2b. pod created → driver process started (node agent)",
    "startup_s": "3. driver process start → first batch done",
    "jvm_session_declarations_s": "3.1 JVM, session, declarations",
    "state_opened_s": "3.2 state opened",
    "outputs_recovered_s": "3.3 outputs' state restored",
    "query_started_s": "3.4 query started",
    "first_batch_s": "3.5 first batch",
    "after_first_batch_s": "4. first batch done → output line seen",
    "total_s": "total: SIGKILL → output line",
}


def pipeline_manifest() -> dict[str, Any]:
    """The operator tests' word count, relaunched at once however often it dies. The driver
    gets bench/resume/run.py's settings (memory, no UI), so that part 3 compares with
    that benchmark's resume; the operator sets the master itself."""
    conf = {key: value for key, value in SPARK_CONF.items() if key != "spark.master"}
    return wordcount(PIPELINE, application={"sparkConf": conf},
                     persistence={"snapshotIntervalSeconds": SNAPSHOT_INTERVAL_S},
                     restartPolicy={"backoff": {"initialSeconds": 0, "maxSeconds": 0, "jitter": 0},
                                    "maxFailures": 1000})


# ---- the cluster side -----------------------------------------------------------------------

def install_crds(api: client.ApiClient) -> None:
    """The CRDs of crds/, created or replaced (a cluster kept from an older checkout may
    hold an older schema), and established."""
    extensions = client.ApiextensionsV1Api(api)
    for path in sorted(CRDS.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            try:
                extensions.create_custom_resource_definition(crd)
            except client.ApiException as error:
                if error.status != 409:
                    raise
                current = extensions.read_custom_resource_definition(crd["metadata"]["name"])
                assert current.metadata is not None, "a stored CRD has metadata"
                crd["metadata"]["resourceVersion"] = current.metadata.resource_version
                extensions.replace_custom_resource_definition(crd["metadata"]["name"], crd)

    def established() -> bool:
        status = extensions.read_custom_resource_definition(f"{PLURAL}.{GROUP}").status
        conditions = (status.conditions if status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait("the PersistentPipeline CRD established", established, 30, every=0.5)


def new_namespace(info: ClusterInfo, api: client.ApiClient) -> Namespace:
    """A namespace as the operator tests' ``ns`` fixture prepares one: Pod Security
    "restricted", the driver's service account and role, the claims ``state`` and ``data``."""
    name = f"ppl-bench-recovery-{uuid.uuid4().hex[:5]}"
    ns = Namespace(name, info, api)
    ns.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=RESTRICTED)))
    wait("the default service account", lambda: ns.core.list_namespaced_service_account(name).items, 30)
    ns.apply(*DRIVER_RBAC, claim("state"), claim("data"))
    return ns


def remove(ns: Namespace, operator: OperatorProcess | None) -> None:
    """The pipeline deleted while the operator still runs (it stops the driver and releases
    its finalizer), then the namespace and the claims' folders on this machine."""
    if ns.pipeline(PIPELINE) is not None:
        ns.delete(PIPELINE)
        try:
            wait("the pipeline deleted", lambda: ns.pipeline(PIPELINE) is None, 120, every=1)
        except TimeoutError as error:
            progress(f"{error}; dropping its finalizer")
            ns.custom.patch_namespaced_custom_object(GROUP, VERSION, ns.name, PLURAL, PIPELINE,
                                                     {"metadata": {"finalizers": None}})
    if operator is not None:
        operator.stop()
    ns.core.delete_namespace(ns.name)
    try:
        wait("the namespace deleted", lambda: not ns.core.list_namespace(
            field_selector=f"metadata.name={ns.name}").items, 120, every=1)
    except TimeoutError as error:
        progress(f"{error}; left for the cluster to finish")
    shutil.rmtree(PV_ROOT / ns.name, ignore_errors=True)


def failed_hint(ns: Namespace) -> str:
    status = ns.status(PIPELINE)
    return f"the pipeline is {status.get('phase', 'without status')}: {status.get('message', '')}"


# ---- clocks ---------------------------------------------------------------------------------

def boot_time() -> float:
    """When this machine booted, in wall-clock seconds (to the clock's resolution; /proc/stat's
    ``btime`` has whole seconds only)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def process_start(pid: int, boot: float) -> float:
    """The wall-clock time process ``pid`` started (it must still run)."""
    ticks = start_ticks(pid)
    if ticks is None:
        raise RuntimeError(f"process {pid} is gone: its start time cannot be read")
    return boot + ticks / os.sysconf("SC_CLK_TCK")


# ---- the history ----------------------------------------------------------------------------

class Lines:
    """Counts the lines of a growing file, reading each byte once."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self.count = 0

    def read(self) -> int:
        try:
            with open(self._path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return 0
        self._offset += len(data)
        self.count += data.count(b"\n")
        return self.count


def load_history(ns: Namespace, data: Path, keys: int) -> float:
    """Writes ``keys`` distinct words, creates the pipeline and waits until its output has
    a line for each (every word is new, so each adds one line). Returns the seconds that took."""
    per_file = -(-keys // HISTORY_FILES)
    for number in range(HISTORY_FILES):
        words = range(number * per_file, min(keys, (number + 1) * per_file))
        write_words(data, f"history-{number}.csv", [f"w{k:07d}" for k in words])
    began = time.monotonic()
    ns.apply(pipeline_manifest())
    lines = Lines(data / OUTPUT)

    def done() -> bool:
        if ns.status(PIPELINE).get("phase") in ("Invalid", "Failed"):
            raise SystemExit(f"the history was not processed: {failed_hint(ns)}")
        return lines.read() >= keys

    wait(f"a line for each of the {keys:,} words", done, HISTORY_TIMEOUT_S, every=1)
    return time.monotonic() - began


# ---- one kill -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Round:
    """One SIGKILL and the moments after it, as seconds between them."""

    marker: str
    relaunches: int
    """Driver pods created after the kill; more than 1 when a replacement failed too (the
    operator's share then holds its life)."""
    detection_s: float
    operator_s: float
    container_start_s: float
    running_reported_s: float
    """From the replacement's creation to its container reported running (watch receipt)."""
    startup_s: float
    after_first_batch_s: float
    total_s: float
    startup: QueryStartup
    """The new driver's start-up line as it logged it."""

    def parts(self) -> dict[str, float]:
        logged = self.startup
        return {
            "detection_s": self.detection_s, "operator_s": self.operator_s,
            "container_start_s": self.container_start_s, "startup_s": self.startup_s,
            "jvm_session_declarations_s": logged.declared_s,
            "state_opened_s": logged.state_s, "outputs_recovered_s": logged.recovered_s,
            "query_started_s": logged.starting_s, "first_batch_s": logged.batch_s,
            "after_first_batch_s": self.after_first_batch_s, "total_s": self.total_s,
        }


def kill_round(ns: Namespace, pods: PodWatch, data: Path, number: int, settle_s: float) -> Round:
    """Writes a file with a new word and SIGKILLs the driver right after, so that the word
    reaches the output only through the replacement; times the chain of moments to it."""
    wait("the driver running", lambda: ns.driver(PIPELINE), RELAUNCH_TIMEOUT_S, every=0.2)
    time.sleep(settle_s)
    _, victim, _ = driver_process(ns.driver(PIPELINE))
    marker = f"m{number:02d}x{uuid.uuid4().hex[:6]}"
    output = Tail(data / OUTPUT)
    write_words(data, f"{marker}.csv", [marker])
    ns.kill_driver(PIPELINE)
    killed = time.time()
    wait(f"{marker}'s output line", lambda: output.has(marker), OUTPUT_TIMEOUT_S)
    seen = time.time()
    return split(ns, pods, marker, pods.seen[victim], killed, seen)


def split(ns: Namespace, pods: PodWatch, marker: str, victim: dict[str, float], killed: float,
          seen: float) -> Round:
    """The moments between the kill and the output line: the victim's end, the replacement's
    creation and its process's start (from the watch and /proc), its first batch (its log)."""
    # The pod that wrote the line is the one running now; read while its process lives.
    pod, uid, pid = driver_process(ns.driver(PIPELINE))
    started = process_start(pid, boot_time())
    logged = startup_line(ns, pod)
    new = pods.seen[uid]
    ended = wait("the killed pod's end seen", lambda: victim.get("ended") or victim.get("deleted"), 10)
    startup_s = logged.total_s
    return Round(
        marker=marker, relaunches=sum(1 for marks in list(pods.seen.values()) if marks["added"] > killed),
        detection_s=round(ended - killed, 3), operator_s=round(new["added"] - ended, 3),
        container_start_s=round(started - new["added"], 3),
        running_reported_s=round(new.get("running", seen) - new["added"], 3),
        startup_s=round(startup_s, 3), after_first_batch_s=round(seen - started - startup_s, 3),
        total_s=round(seen - killed, 3), startup=logged)


def driver_process(pod: client.V1Pod | None) -> tuple[str, str, int]:
    """A running driver pod's name, uid and process id (the node agent's container id)."""
    if pod is None:
        raise RuntimeError(f"no {PIPELINE} driver is running")
    meta, status = pod.metadata, pod.status
    assert meta and meta.name and meta.uid, "a stored pod has a name and a uid"
    assert status and status.container_statuses and status.container_statuses[0].container_id, "running"
    return meta.name, meta.uid, int(status.container_statuses[0].container_id.removeprefix("localcluster://"))


def startup_line(ns: Namespace, pod: str) -> QueryStartup:
    """The driver's start-up line (logged once its first batch is done, beside its output)."""
    def logged() -> list[QueryStartup]:
        return parse(ns.core.read_namespaced_pod_log(pod, ns.name, container="driver"))

    found: list[QueryStartup] = wait(f"the start-up line in {pod}'s log", logged, LOG_LINE_TIMEOUT_S, every=0.5)
    return found[0]  # the word count has one query


# ---- report ---------------------------------------------------------------------------------

def summarize(rounds: list[Round]) -> dict[str, dict[str, float]]:
    return {part: summary([r.parts()[part] for r in rounds]) for part in PARTS}


def goal(totals: dict[str, float]) -> dict[str, Any]:
    return {"total_at_most_s": GOAL_S, "median_total_s": totals["median"],
            "met": totals["median"] <= GOAL_S, "every_round_met": totals["max"] <= GOAL_S}


def table(rounds: list[Round], summaries: dict[str, dict[str, float]], keys: int) -> str:
    header = " | ".join(f"round {n + 1}" for n in range(len(rounds)))
    rows = [f"Recovery under the operator, {keys:,} keys of state, restart backoff 0 (seconds):", "",
            f"| part | median | spread | {header} |", "| --- | ---: | ---: |" + " ---: |" * len(rounds)]
    for part, label in PARTS.items():
        values = " | ".join(f"{r.parts()[part]:.2f}" for r in rounds)
        shown = summaries[part]
        rows.append(f"| {label} | {shown['median']:.2f} | {shown['min']:.2f} to {shown['max']:.2f} | {values} |")
    reached = goal(summaries["total_s"])
    rows += ["", f"Goal: total at most {GOAL_S:g} s at 1M keys: {'met' if reached['met'] else 'missed'} "
                 f"(median {reached['median_total_s']:.2f} s; every round: "
                 f"{'yes' if reached['every_round_met'] else 'no'})."]
    return "\n".join(rows)


# ---- main -----------------------------------------------------------------------------------

def measure(info: ClusterInfo, options: argparse.Namespace) -> dict[str, Any]:
    api = config.new_client_from_config(config_file=str(info.kubeconfig))
    install_crds(api)
    ns = new_namespace(info, api)
    data = ns.folder("data")
    logs = ROOT / ".cache" / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    operator_log = logs / f"recovery-operator-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"
    operator, pods = None, PodWatch(ns.core, ns.name)
    try:
        operator = OperatorProcess(info.kubeconfig, ns.name, operator_log)
        progress(f"namespace {ns.name}: {options.keys:,} words of history, then the pipeline")
        history_s = load_history(ns, data, options.keys)
        progress(f"the history is in the output after {history_s:.1f} s; waiting two snapshot intervals")
        # The history is one huge batch: a kill right after it would replay it from the
        # changelogs. A pipeline running for a while has snapshots at most an interval old.
        time.sleep(2 * SNAPSHOT_INTERVAL_S)
        rounds = []
        for number in range(options.rounds):
            rounds.append(kill_round(ns, pods, data, number, options.settle_seconds))
            shown = rounds[-1].parts()
            progress(f"round {number + 1}/{options.rounds}: total {shown['total_s']:.2f} s ("
                     + ", ".join(f"{part.removesuffix('_s')} {shown[part]:.2f}" for part in PARTS
                                 if part != "total_s") + ")")
    except TimeoutError as error:
        raise SystemExit(f"{error}; {failed_hint(ns)}; the operator's log: {operator_log}") from None
    finally:
        pods.stop()
        remove(ns, operator)
    summaries = summarize(rounds)
    return {"keys": options.keys, "history_files": HISTORY_FILES, "history_s": round(history_s, 2),
            "settle_seconds": options.settle_seconds, "spec": pipeline_manifest()["spec"],
            "rounds": [{**asdict(r), "parts": r.parts()} for r in rounds], "summary": summaries,
            "goal": goal(summaries["total_s"]), "table": table(rounds, summaries, options.keys),
            "operator_log": str(operator_log.relative_to(ROOT))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct words of state")
    parser.add_argument("--rounds", type=int, default=5, help="driver kills")
    parser.add_argument("--settle-seconds", type=float, default=2.0,
                        help="how long a driver runs after its start-up before the next kill")
    options = parser.parse_args()
    cluster = Cluster(out=progress)
    started_here = not cluster.is_up()
    info = cluster.ensure_up()
    try:
        results = measure(info, options)
    finally:
        if started_here:
            cluster.down()
    print(results["table"], flush=True)
    write_results("recovery", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
