"""What the operator remembers about a pipeline between reconciles. It lives in the
resource's status (pipeline_operator.status reads and writes it), so a restarted
operator carries on where the last one stopped. Every collection in it is bounded
(Kubeflow spark-operator #2025: a status that grew with every attempt)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline_operator.observe import BackfillReport, QueryReport
from spark_app.contract import TableReport

RECENT_RESTARTS = 5
MAX_QUERIES = 10
MAX_BACKFILLS = 10
MAX_OFFSETS_PER_QUERY = 20
MAX_LAG_PARTITIONS = 100
"""Per query, the Kafka partitions whose lag the status keeps: the most lagging ones."""
MAX_VALUE_CHARS = 512
MAX_MESSAGE_CHARS = 1024


@dataclass(frozen=True)
class Failure:
    """How a driver ended when it was not asked to."""

    reason: str
    exit_code: int | None
    message: str
    time: float
    epoch: int
    pod_uid: str = ""
    generation: int = 0
    """The resource's generation when it failed: a spec change since then ends the backoff wait."""


@dataclass(frozen=True)
class Restart:
    time: float
    reason: str
    epoch: int
    """The epoch of the driver launched by this restart."""


@dataclass(frozen=True)
class Halt:
    """The operator stopped relaunching (BackoffExhausted, Failed, Completed) until the
    user changes the spec or the restartNonce."""

    reason: str
    generation: int
    restart_nonce: str


@dataclass(frozen=True)
class Checkpoint:
    """The newest commit the operator knows of (from the driver's reports)."""

    time: float | None
    epoch: int
    queries: Mapping[str, QueryReport] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"{name} batch {q.batch}" for name, q in sorted(self.queries.items()) if q.batch is not None]
        return ", ".join(parts) or "no batch committed yet"

    def lag(self) -> dict[tuple[str, str, str], int]:
        """(source, topic, partition) -> records beyond the committed offsets: the slowest
        output's where several read a source (each reads it on its own)."""
        found: dict[tuple[str, str, str], int] = {}
        for query in self.queries.values():
            for pid, topics in query.lag.items():
                for topic, partitions in topics.items():
                    for partition, n in partitions.items():
                        found[(pid, topic, partition)] = max(n, found.get((pid, topic, partition), 0))
        return found


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Memory:
    phase: str = ""
    message: str = ""
    epoch: int = 0
    """The highest epoch launched; the next launch takes a higher one."""
    driver_uid: str = ""
    """The live driver pod the operator answers for; empty when none is known."""
    restarts_total: int = 0
    consecutive_failures: int = 0
    recent_restarts: tuple[Restart, ...] = ()
    last_failure: Failure | None = None
    ended_uid: str = ""
    """The last ended driver pod whose outcome is recorded, so that it counts once."""
    next_launch_at: float | None = None
    next_launch_reason: str = ""
    epoch_floor: int = 0
    """The lowest epoch the storage accepts, learned from a driver refused as stale."""
    halt: Halt | None = None
    stopping: str = ""
    """Why the operator asked the driver to stop, until its pod is gone."""
    state_root: str = ""
    reset_nonce: str = ""
    stateless_generation: int = 0
    applied_hash: str = ""
    """The pod hash of the spec last launched (stateless mode starts a new generation when it changes)."""
    checkpoint: Checkpoint | None = None
    announced_epoch: int = 0
    """The epoch whose start (resumed or empty) has been announced with an Event."""
    running_since: float | None = None
    """When the operator first saw that epoch's driver report it is running."""
    announced_problem: str = ""
    """The last invalid-spec message announced, so that an Event is posted once per problem."""
    storage_outages: int = 0
    """Drivers that ended in a row because the state's storage was unreachable (exit code 5):
    the backoff's exponent for them, apart from the failure count."""
    degraded: str = ""
    """The reason a running driver is Degraded, if it is."""
    conditions: tuple[Condition, ...] = ()
    backfills: Mapping[str, BackfillReport] = field(default_factory=dict)
    """Each backfilling source's progress, by persistent id, from the driver's reports."""
    backfill_seen_at: float | None = None
    """When ``backfills`` was last taken from a report (they follow at most every
    checkpoint_refresh_seconds, or at once when one starts, pauses, resumes or finishes)."""

    tables: Mapping[str, TableReport] = field(default_factory=dict)
    """The shared tables the driver publishes, as it last reported them (at most MAX_TABLES,
    each with at most MAX_HOLDERS holders)."""

    def describe_backfills(self) -> str:
        """One line for kubectl get -o wide: "accounts 37.5% 1.2k rows/s ETA 4m, users done"."""
        if len(self.backfills) == 1:
            return next(iter(self.backfills.values())).describe()
        return ", ".join(f"{pid} {b.describe()}" for pid, b in sorted(self.backfills.items()))


MAX_TABLES = 20
MAX_HOLDERS = 20


def bounded_tables(tables: Mapping[str, TableReport]) -> dict[str, TableReport]:
    """At most MAX_TABLES tables, each with its MAX_HOLDERS furthest-behind holders: the
    status stays bounded however many readers a table has."""
    return {name: replace(t, holders=tuple(sorted(t.holders, key=lambda h: (-h.behind, h.reader))[:MAX_HOLDERS]))
            for name, t in sorted(tables.items())[:MAX_TABLES]}


def describe_tables(tables: Mapping[str, TableReport]) -> str:
    """For the printer column: "customers v42 2 readers (1 behind by 3)"."""
    parts = []
    for name, t in sorted(tables.items()):
        behind = [h for h in t.holders if h.behind]
        text = f"{name} v{t.version if t.version is not None else '-'} {len(t.holders)} readers"
        if behind:
            text += f" ({len(behind)} behind by {max(h.behind for h in behind)})"
        parts.append(text)
    return ", ".join(parts)


def bounded_queries(queries: Mapping[str, QueryReport]) -> dict[str, QueryReport]:
    """At most MAX_QUERIES queries, each with at most MAX_OFFSETS_PER_QUERY offsets of
    bounded size: a pipeline with many sources cannot grow the status without limit."""
    kept: dict[str, QueryReport] = {}
    for name in sorted(queries)[:MAX_QUERIES]:
        q = queries[name]
        offsets = {pid: _bounded(q.offsets[pid]) for pid in sorted(q.offsets)[:MAX_OFFSETS_PER_QUERY]}
        kept[name] = QueryReport(batch=q.batch, commit_time_ms=q.commit_time_ms, offsets=offsets,
                                 backlog=q.backlog, active=q.active, malformed=q.malformed,
                                 iterate=_bounded(q.iterate), lag=_bounded_lag(q.lag))
    return kept


def _bounded_lag(lag: Mapping[str, Mapping[str, Mapping[str, int]]]) -> dict[str, dict[str, dict[str, int]]]:
    """The MAX_LAG_PARTITIONS most-lagging partitions of the query's first
    MAX_OFFSETS_PER_QUERY sources (as its offsets are bounded)."""
    partitions = sorted(((n, pid, topic, partition) for pid in sorted(lag)[:MAX_OFFSETS_PER_QUERY]
                         for topic, parts in lag[pid].items() for partition, n in parts.items()),
                        key=lambda item: -item[0])[:MAX_LAG_PARTITIONS]
    kept: dict[str, dict[str, dict[str, int]]] = {}
    for n, pid, topic, partition in partitions:
        kept.setdefault(pid, {}).setdefault(topic, {})[partition] = n
    return kept


def bounded_backfills(backfills: Mapping[str, BackfillReport]) -> dict[str, BackfillReport]:
    return {pid: backfills[pid] for pid in sorted(backfills)[:MAX_BACKFILLS]}


def truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bounded(value: Any) -> Any:
    if value is None:
        return None
    text = json.dumps(value, sort_keys=True, default=str)
    return value if len(text) <= MAX_VALUE_CHARS else {"truncated": truncate(text, MAX_VALUE_CHARS)}
