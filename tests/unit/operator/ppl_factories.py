"""Small factories for the operator's unit tests: raw specs, parsed specs, driver pods,
driver reports, and observations for the decision function."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

from pipeline_operator import names
from pipeline_operator.lifecycle import Observed, Tunables
from pipeline_operator.memory import Checkpoint, Condition, Failure, Halt, Memory, Restart
from pipeline_operator.observe import BackfillReport, DriverPod, DriverReport, QueryReport
from pipeline_operator.policy import StateRoot, state_root
from pipeline_operator.spec import PipelineSpec, parse_spec

NAMESPACE, NAME, UID = "team", "wc", "uid-ppl"
NOW = 1_800_000_000.0
TUNABLES = Tunables(resync_seconds=10, poll_seconds=2, recheck_seconds=30, report_stale_after_seconds=60)

FILESYSTEM_SPEC: dict[str, Any] = {
    "application": {"file": "examples/wordcount.py", "args": ["--input", "/data/in", "--output", "/data/out.jsonl"]},
    "persistence": {"filesystem": {"claimName": "state"}},
}
S3_SPEC: dict[str, Any] = {
    "application": {"module": "pipelines.ads", "sparkConf": {"spark.sql.shuffle.partitions": "4"}},
    "persistence": {
        "snapshotIntervalSeconds": 5,
        "s3": {"bucket": "pipelines", "endpoint": "http://127.0.0.1:9000", "region": "eu-west-1",
               "credentialsSecret": {"name": "s3-creds"}},
    },
}


def raw(base: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    """A raw spec; keyword arguments are dotted paths (persistence__s3__bucket="x")."""
    spec = copy.deepcopy(base or FILESYSTEM_SPEC)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        if value is _DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return spec


_DELETE = object()
DELETE = _DELETE


def spec(base: dict[str, Any] | None = None, **changes: Any) -> PipelineSpec:
    return parse_spec(raw(base, **changes), namespace=NAMESPACE, name=NAME)


def root_of(s: PipelineSpec, memory: Memory | None = None) -> str:
    root = state_root(s, memory or Memory(stateless_generation=1), launching=False)
    assert isinstance(root, StateRoot)
    return root.uri


def driver(s: PipelineSpec, *, epoch: int = 1, uid: str = "pod-1", phase: str = "Running",
           started_at: float | None = NOW - 30, created_at: float = NOW - 40, **fields: Any) -> DriverPod:
    """A driver pod launched from ``s`` (its annotations match the spec)."""
    pod = DriverPod(name=names.driver_pod_name(NAME), uid=uid, epoch=epoch, spec_hash=s.pod_hash,
                    restart_nonce=s.restart_nonce, state_root=root_of(s), created_at=created_at, phase=phase,
                    started_at=started_at if phase == "Running" else None)
    return replace(pod, **fields)


def ended(s: PipelineSpec, exit_code: int, *, message: str = "", reason: str = "Error", **fields: Any) -> DriverPod:
    return driver(s, phase="Succeeded" if exit_code == 0 else "Failed", exit_code=exit_code, message=message,
                  reason=reason, **fields)


def report(epoch: int = 1, *, state: str = "running", stored_epoch: int = 0, reported_at: float = NOW - 2,
           **queries: QueryReport) -> DriverReport:
    return DriverReport(epoch=epoch, stored_epoch=stored_epoch, state=state, reported_at=reported_at,
                        queries=queries)


def observed(s: PipelineSpec | None, memory: Memory | None = None, **fields: Any) -> Observed:
    return Observed(now=fields.pop("now", NOW), generation=fields.pop("generation", 1), uid=UID, spec=s,
                    memory=memory or Memory(), **fields)


def launched(s: PipelineSpec, epoch: int = 1, **fields: Any) -> Memory:
    """The memory right after launching epoch ``epoch`` of ``s`` (driver not yet adopted)."""
    return Memory(phase="Starting", epoch=epoch, state_root=root_of(s), applied_hash=s.pod_hash,
                  stateless_generation=1 if s.upgrade_mode == "stateless" else 0, **fields)


def pod_json(s: PipelineSpec, *, epoch: int = 1, uid: str = "pod-1", status: dict[str, Any] | None = None,
             report_json: dict[str, Any] | None = None, deleting: bool = False) -> dict[str, Any]:
    """A driver pod as the API server returns it."""
    annotations = {names.ANNOTATION_EPOCH: str(epoch), names.ANNOTATION_SPEC_HASH: s.pod_hash,
                   names.ANNOTATION_RESTART_NONCE: s.restart_nonce, names.ANNOTATION_STATE_ROOT: root_of(s)}
    if report_json is not None:
        annotations["sparkapp.dev/status"] = json.dumps(report_json)
    meta: dict[str, Any] = {"name": names.driver_pod_name(NAME), "namespace": NAMESPACE, "uid": uid,
                            "annotations": annotations, "creationTimestamp": "2027-01-15T08:00:00Z"}
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T08:05:00Z"
    return {"metadata": meta, "status": status or {"phase": "Pending"}}


# A memory with every field set, for the status's round trip and its schema.
CONDITIONS = (
    Condition("Ready", "True", "DriverRunning", "driver epoch 4 is running"),
    Condition("Progressing", "False", "Running", "driver epoch 4 is running"),
    Condition("Degraded", "False", "Healthy", ""),
    Condition("CheckpointHealthy", "True", "Committing", "commits are keeping up with the input"),
)
RICH_MEMORY = Memory(
    phase="Running", message="driver epoch 4 is running", epoch=4, driver_uid="pod-4", restarts_total=3,
    consecutive_failures=1, recent_restarts=(Restart(NOW - 60.5, "Error", 3), Restart(NOW - 10.25, "SpecChanged", 4)),
    last_failure=Failure("Error", 1, "boom", NOW - 61.125, 2, "pod-2", 1), ended_uid="pod-2",
    next_launch_at=NOW + 12.5, next_launch_reason="Error", epoch_floor=7, halt=Halt("BackoffExhausted", 2, "n"),
    stopping="SpecChanged", state_root="pvc://state/team/wc", reset_nonce="r1", stateless_generation=2,
    applied_hash="abc", announced_epoch=4, running_since=NOW - 30.5, announced_problem="x", degraded="NoRecentCommit",
    checkpoint=Checkpoint(time=NOW - 5.5, epoch=4, queries={
        "counts": QueryReport(batch=12, commit_time_ms=int((NOW - 5.5) * 1000), offsets={"words": {"files": 3}},
                              backlog=True, malformed=2, iterate={"step": 1}),
        "empty": QueryReport(),
    }),
    conditions=CONDITIONS,
    backfills={"accounts": BackfillReport(rows_read=375, rows_total=1000, percent=37.5, rows_per_second=1200.0,
                                          eta_seconds=240.0, version=7),
               "users": BackfillReport(rows_read=10, rows_total=10, percent=100.0, finished=True, version=3)},
    backfill_seen_at=NOW - 4.25,
)
