"""Pure rules the decision function applies: the restart backoff, where the state of the
next driver lives, and whether a running driver is healthy."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline_operator.errors import InvalidSpec
from pipeline_operator.memory import Memory
from pipeline_operator.observe import DriverPod, format_time
from pipeline_operator.spec import (
    FilesystemBackend,
    PipelineSpec,
    RestartPolicy,
    S3Backend,
    TableReference,
    parse_spec,
    uri_in_pod,
)
from spark_app import contract


def backoff_delay(policy: RestartPolicy, failures: int, seed: str) -> float:
    """Seconds to wait before relaunch number ``failures`` (1 for the first failure):
    initial x multiplier^(failures-1), spread by the jitter, never above the cap.
    The jitter is drawn from ``seed`` so the function stays pure and repeatable."""
    b = policy.backoff
    base = min(b.max_seconds, b.initial_seconds * b.multiplier ** max(0, failures - 1))
    return max(0.0, min(b.max_seconds, base * (1 + b.jitter * _unit(seed))))


def _unit(seed: str) -> float:
    """A number in [-1, 1] determined by ``seed``."""
    digest = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big")
    return digest / 2**64 * 2 - 1


@dataclass(frozen=True)
class StateRoot:
    uri: str
    stateless_generation: int


@dataclass(frozen=True)
class RootRefused:
    message: str


def state_root(spec: PipelineSpec, memory: Memory, *, launching: bool) -> StateRoot | RootRefused:
    """Where the next (``launching``) or current driver keeps its state.

    The base is the backend's root for this pipeline; a persistence.resetNonce adds
    ``/resets/<nonce>`` (empty state, nothing deleted). Under ``stateless`` each launch of
    a new spec takes ``/generations/<n+1>``. Under ``last-state`` the stored root is kept,
    and a spec that points elsewhere is refused unless its resetNonce changed too.
    """
    prefix = spec.persistence.base_uri
    if spec.persistence.reset_nonce:
        prefix += f"/resets/{spec.persistence.reset_nonce}"
    generation = memory.stateless_generation
    if spec.upgrade_mode == "stateless":
        if launching and (generation == 0 or spec.pod_hash != memory.applied_hash):
            generation += 1
        return StateRoot(f"{prefix}/generations/{max(generation, 1)}", generation)
    if not memory.state_root or spec.persistence.reset_nonce != memory.reset_nonce:
        return StateRoot(prefix, generation)
    if memory.state_root == prefix or memory.state_root.startswith(prefix + "/generations/"):
        return StateRoot(memory.state_root, generation)
    return RootRefused(
        f"the state lives at {memory.state_root}, but the spec now points at {prefix}: under "
        "upgradeMode last-state that would abandon the stored state. Restore the previous "
        "persistence settings, or change spec.persistence.resetNonce to start from empty state there"
    )


@dataclass(frozen=True)
class Health:
    """CheckpointHealthy and Degraded for a running driver."""

    checkpoint_status: str
    checkpoint_reason: str
    checkpoint_message: str
    degraded_reason: str = ""
    degraded_message: str = ""


def assess(spec: PipelineSpec, pod: DriverPod, now: float, report_stale_after: float,
           running_since: float | None = None) -> Health:
    """Degraded when input waits and nothing was committed for the spec's window, or when
    the driver stopped refreshing its report while it had work to do.

    The window counts from the last commit, but not from before this driver started
    running (``running_since``): starting Spark and catching up after a restart are not
    a stall.

    The report is only rewritten when it changes (spark_app.runtime.reporting), so an
    idle driver's report ages without anything being wrong: staleness counts only when
    the last report said there was work."""
    report = pod.report
    if report is None or report.epoch != pod.epoch:
        return Health("Unknown", "NoDriverReport",
                      "the driver has not reported its progress yet (its service account needs "
                      "permission to patch its own pod)")
    if report.state == "starting":
        return Health("Unknown", "DriverStarting", "the driver is opening its state and starting its queries")
    window = spec.persistence.degraded_after_seconds
    started = running_since or pod.started_at or pod.created_at
    late = sorted(
        name for name, q in report.queries.items()
        if q.backlog and now - max(started, (q.commit_time_ms or 0) / 1000) > window
    )
    if late:
        message = (f"input is waiting but {', '.join(late)} committed nothing for over {window}s "
                   f"({spec.persistence.degraded_after_seconds // spec.persistence.snapshot_interval_seconds} "
                   "snapshot intervals)")
        return Health("False", "NoRecentCommit", message, "NoRecentCommit", message)
    reported_at = report.reported_at or 0.0  # a report read from a pod is always stamped
    age = now - reported_at
    if age > report_stale_after and not report.idle:
        message = (f"the driver's last report ({format_time(reported_at, fraction=False)}) is over "
                   f"{report_stale_after:.0f}s old, and it had work to do then")
        return Health("Unknown", "DriverReportStale", message, "DriverReportStale", message)
    if report.idle:
        return Health("True", "Idle", "all available input is committed")
    return Health("True", "Committing", "commits are keeping up with the input")


def root_taken_by(spec: PipelineSpec, created: str, others: Iterable[Mapping[str, Any]]) -> str:
    """The namespace/name of a PersistentPipeline created before this one (``created`` is
    this one's creationTimestamp) whose state overlaps this one's: the same root, or one
    inside the other (a reset of the outer one would delete the inner one's state). ""
    if none: the older pipeline keeps its state, the newer one is refused."""
    mine = _root(spec)
    order = (created, spec.namespace, spec.name)
    for other in sorted(others, key=lambda o: (o["metadata"].get("creationTimestamp") or "",
                                               o["metadata"]["namespace"], o["metadata"]["name"])):
        meta = other["metadata"]
        if (meta.get("creationTimestamp") or "", meta["namespace"], meta["name"]) >= order or meta.get("deletionTimestamp"):
            continue
        try:
            theirs = _root(parse_spec(other.get("spec") or {}, namespace=meta["namespace"], name=meta["name"]))
        except InvalidSpec:
            continue
        if mine[0] == theirs[0] and _nested(mine[1], theirs[1]):
            return f"{meta['namespace']}/{meta['name']}"
    return ""


def _root(spec: PipelineSpec) -> tuple[tuple[str, ...], str]:
    """Where a pipeline's state lives: the store (a namespace's claim, or an S3 endpoint's
    bucket) and the path within it."""
    backend = spec.persistence.backend
    if isinstance(backend, FilesystemBackend):
        return ("pvc", spec.namespace, backend.claim_name), backend.path.strip("/")
    assert isinstance(backend, S3Backend)
    return ("s3", backend.options.endpoint or "aws", backend.bucket), backend.prefix.strip("/")


def _nested(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


@dataclass(frozen=True)
class ResolvedInputs:
    """The shared tables a reader reads, as its driver reaches them, and what keeps the
    reader waiting (one line per table that cannot be read yet)."""

    tables: tuple[contract.TableInput, ...] = ()
    waiting: tuple[str, ...] = ()


def resolve_inputs(spec: PipelineSpec, publishers: Mapping[tuple[str, str], Mapping[str, Any] | str | None]
                   ) -> ResolvedInputs:
    """Where each ``spec.inputs[].table`` is, from its publisher's resource (as read, by
    namespace and name; None: absent; a string: why it could not be read). A table is readable once its publisher lists it in
    spec.tables, grants the reader's namespace, and has reported a version of it; until
    then the reader waits, and starts by itself when that changes (the caller rechecks).

    A table on a claim is read through the reader's own mount of that claim (the same
    claim, hence the same namespace); on S3, with the reader's own credentials."""
    tables: list[contract.TableInput] = []
    waiting: list[str] = []
    for number, (_, ref) in enumerate(spec.table_inputs):
        where = f"spec.inputs[{number}].table {ref}"
        found = _table_input(spec, ref, publishers.get((ref.namespace, ref.pipeline)))
        if isinstance(found, str):
            waiting.append(f"{where}: {found}")
        else:
            tables.append(found)
    return ResolvedInputs(tuple(tables), tuple(waiting))


def _table_input(spec: PipelineSpec, ref: TableReference, resource: Mapping[str, Any] | str | None
                 ) -> contract.TableInput | str:
    publisher = f"PersistentPipeline {ref.namespace}/{ref.pipeline}"
    if isinstance(resource, str):
        return f"{publisher} cannot be read: {resource}"
    if resource is None:
        return f"{publisher} does not exist (yet)"
    try:
        published = parse_spec(resource.get("spec") or {}, namespace=ref.namespace, name=ref.pipeline)
    except InvalidSpec as invalid:
        return f"the spec of {publisher} is invalid ({invalid.problems[0]})"
    table = next((t for t in published.tables if t.name == ref.name), None)
    if table is None:
        return f"{publisher} does not publish a table {ref.name!r} (its spec.tables does not list it)"
    if not table.grants(spec.namespace, ref.namespace):
        return (f"{publisher} does not grant namespace {spec.namespace} (add it to the readers of its "
                f"spec.tables entry {ref.name!r})")
    status = resource.get("status") or {}
    root = (status.get("persistence") or {}).get("root") or ""
    reported = (status.get("tables") or {}).get(ref.name) or {}
    if not root or reported.get("version") is None:
        return "no version yet (its publisher has not committed a batch of it)"
    backend, own = published.persistence.backend, spec.persistence.backend
    if isinstance(backend, FilesystemBackend):
        if (not isinstance(own, FilesystemBackend) or own.claim_name != backend.claim_name
                or spec.namespace != ref.namespace):
            return (f"it lives on claim {backend.claim_name} of namespace {ref.namespace}, which this pipeline "
                    "does not mount: keep this pipeline's state on the same claim, or the publisher's on S3")
        return contract.TableInput(table=str(ref), uri=f"{uri_in_pod(root)}/tables/{ref.name}")
    return contract.TableInput(table=str(ref), uri=f"{root}/tables/{ref.name}", s3=backend.options)
