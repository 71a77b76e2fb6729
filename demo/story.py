"""What the demo and the end-to-end tests share: the two pipelines' input files, what their
outputs must fold to, and reading pipelines, pods and Events through kubectl.

The outputs are changelogs (one JSON row per line with ``diff`` +1 or -1). Folding one
checks it on the way: a +1 must not land on a live key (a duplicated row) and a -1 must
retract exactly the live row (a lost one would not be there). The folded table is then
compared with what a plain Python computation over all input files gives.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from demo.targets import Target
from localcluster import testing

T = TypeVar("T")
GROUP = "sparkapp.dev"
WORDCOUNT_OUTPUT = "wordcount/counts.jsonlines"
COMPONENTS_OUTPUT = "components/labels.jsonlines"
KAFKACOUNT_OUTPUT = "kafkacount/counts.jsonlines"
KAFKA_TOPIC = "words"
VOCABULARY = ("apple", "banana", "cherry", "damson", "elder", "fig", "grape", "hazel", "kiwi", "lemon", "lime",
              "mango", "nectarine", "olive", "peach", "pear", "plum", "quince", "raspberry", "sloe")

# Edge files of the connected components pipeline, in the order they are fed: `u,v,diff`.
# The first three only insert (a stored fixed point is reused or warm-started); the last
# deletes the edge 3-4, which splits a component (delete and rederive).
EDGE_FILES: dict[str, list[tuple[int, int, int]]] = {
    "1.csv": [(1, 2, 1), (2, 3, 1), (3, 4, 1), (10, 11, 1), (11, 12, 1), (20, 21, 1)],
    "2.csv": [(4, 5, 1), (12, 13, 1)],
    "3.csv": [(5, 10, 1), (30, 31, 1)],
    "4.csv": [(3, 4, -1)],
}


class ChangelogError(AssertionError):
    """The output changelog is inconsistent: a row was duplicated or lost."""


# ---- inputs ---------------------------------------------------------------------------------


def word_file(seed: int, count: int) -> list[str]:
    """A deterministic list of words (the same seed gives the same file everywhere)."""
    rng = random.Random(seed)
    return [rng.choice(VOCABULARY) for _ in range(count)]


def words_csv(words: Iterable[str]) -> str:
    return "word\n" + "".join(f"{w}\n" for w in words)


def edges_csv(edges: Iterable[tuple[int, int, int]]) -> str:
    return "u,v,diff\n" + "".join(f"{u},{v},{d}\n" for u, v, d in edges)


def producer_pod(name: str, image: str, words: Iterable[str]) -> dict[str, Any]:
    """A pod that writes ``words`` to the demo's topic in one transaction and exits
    (examples/produce_words.py in the spark-app image), restricted as the namespace asks."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "produce-words"}},
        "spec": {
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 185, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "produce", "image": image,
                "command": ["python", "examples/produce_words.py"],
                "args": ["--bootstrap-servers", "kafka:9092", "--topic", KAFKA_TOPIC, *words],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


# ---- what the outputs must be ----------------------------------------------------------------


def fold(changelog: str | None, key: str) -> dict[Any, dict[str, Any]]:
    """The table a changelog describes, keyed by one column; raises ChangelogError at the
    first line that adds a row whose key is live or retracts a row that is not."""
    table: dict[Any, dict[str, Any]] = {}
    for number, line in enumerate((changelog or "").splitlines(), start=1):
        if not line.strip():
            continue
        raw = json.loads(line)
        row = {k: v for k, v in raw.items() if k not in ("time", "diff")}
        k = row[key]
        if raw["diff"] == 1:
            if k in table:
                raise ChangelogError(f"line {number} adds {row} while {table[k]} is live: a duplicated row")
            table[k] = row
        else:
            if table.get(k) != row:
                raise ChangelogError(f"line {number} retracts {row}, but the live row is {table.get(k)}: a lost row")
            del table[k]
    return table


def line_count(changelog: str | None) -> int:
    return len([line for line in (changelog or "").splitlines() if line.strip()])


def expected_counts(files: Iterable[list[str]]) -> dict[str, int]:
    return dict(Counter(word for words in files for word in words))


def folded_counts(changelog: str | None) -> dict[str, int]:
    return {word: row["count"] for word, row in fold(changelog, "word").items()}


def expected_labels(files: Iterable[list[tuple[int, int, int]]]) -> dict[int, int]:
    """Connected components of the live edges of ``files`` (their diffs summed); see components."""
    multiplicity: Counter[tuple[int, int]] = Counter()
    for edges in files:
        for u, v, diff in edges:
            multiplicity[(u, v)] += diff
    return components(multiplicity)


def components(live: Mapping[tuple[int, int], int]) -> dict[int, int]:
    """Each vertex of the edges with a positive count, labelled with the smallest vertex of
    its component: a union-find, no Spark (the reference the Spark results are checked against)."""
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for (u, v), count in live.items():
        if count > 0:
            a, b = root(u), root(v)
            parent[max(a, b)] = min(a, b)
    return {vertex: root(vertex) for vertex in parent}


def folded_labels(changelog: str | None) -> dict[int, int]:
    return {vertex: row["label"] for vertex, row in fold(changelog, "vertex").items()}


# ---- the cluster's view, through kubectl ------------------------------------------------------


@dataclass(frozen=True)
class Namespace:
    """One namespace of a target, read with kubectl (the same on every cluster)."""

    target: Target
    name: str

    def get(self, *args: str) -> dict[str, Any]:
        out = self.target.kubectl("get", "-n", self.name, *args, "-o", "json", "--ignore-not-found")
        found: dict[str, Any] = json.loads(out) if out.strip() else {}
        return found

    def pipeline(self, name: str) -> dict[str, Any]:
        return self.get(f"persistentpipelines.{GROUP}", name)

    def status(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.pipeline(name).get("status") or {}
        return found

    def driver(self, pipeline: str) -> dict[str, Any] | None:
        """The driver pod while its container runs, else None."""
        pod = self.get("pod", f"{pipeline}-driver")
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        if not pod or pod["metadata"].get("deletionTimestamp") or not statuses or "running" not in statuses[0]["state"]:
            return None
        return pod

    def epoch(self, pipeline: str) -> int | None:
        return epoch_of(self.status(pipeline))

    def events(self, pipeline: str) -> list[tuple[str, str]]:
        """(reason, message) of the Events about a pipeline, oldest first."""
        items = self.get("events", "--field-selector",
                         f"involvedObject.kind=PersistentPipeline,involvedObject.name={pipeline}").get("items", [])
        items.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"])
        return [(e["reason"], e["message"]) for e in items]

    def checkpoint(self, pipeline: str) -> dict[str, Any]:
        return checkpoint_of(self.status(pipeline))

    def report(self, pipeline: str) -> dict[str, Any]:
        """The running driver's own report (its pod's sparkapp.dev/status annotation): the
        operator copies it into status, bounded; this is the whole of it."""
        pod = self.get("pod", f"{pipeline}-driver")
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get("sparkapp.dev/status")
        found: dict[str, Any] = json.loads(raw) if raw else {}
        return found

    def read(self, relative: str, claim: str = "data") -> str | None:
        return self.target.read_file(self.name, claim, relative)

    def write(self, relative: str, content: str, claim: str = "data") -> None:
        self.target.write_file(self.name, claim, relative, content)


def epoch_of(status: Mapping[str, Any]) -> int | None:
    """The epoch of the pipeline's current driver, from its status."""
    epoch = (status.get("driver") or {}).get("epoch")
    return int(epoch) if epoch is not None else None


def checkpoint_of(status: Mapping[str, Any]) -> dict[str, Any]:
    """The last commit the operator saw of a one-output pipeline: status.checkpoint.queries' only query."""
    queries = (status.get("checkpoint") or {}).get("queries") or {}
    found: dict[str, Any] = next(iter(queries.values()), {})
    return found


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 2.0,
             progress: Callable[[], None] | None = None) -> T:
    """localcluster's poller, at the pace of kubectl calls (every 2 s)."""
    return testing.wait_for(what, probe, timeout, every, progress)


def resumed_from(events: Iterable[tuple[str, str]]) -> list[str]:
    """The messages of the Resumed events ("driver epoch 2 resumed the state of epoch 1
    from checkpoint: ...")."""
    return [message for reason, message in events if reason == "Resumed"]


def reasons(events: Iterable[tuple[str, str]]) -> list[str]:
    return [reason for reason, _ in events]


def iterate_summary(report: Mapping[str, Any]) -> str:
    """How the iterate runs of a driver's report started (cold, reuse, warm, partial)."""
    queries = report.get("queries") or {}
    iterate = next((q["iterate"] for q in queries.values() if q.get("iterate")), None)
    if not iterate:
        return "-"
    runs = ", ".join(f"{mode} {count}" for mode, count in sorted((iterate.get("runs") or {}).items()))
    return (f"runs by how they started: {runs}; the last: {iterate.get('decision')} "
            f"({iterate.get('reason')}), {iterate.get('iterations')} iterations")


def first_words(message: str) -> str:
    """An Event's message without the log tail a crash report may carry."""
    line = message.splitlines()[0] if message else ""
    match = re.match(r"^(.*?\(exit code \d+\))", line)
    return match.group(1) if match else line[:160]
