"""What the metadata log records: the head of every query, as plain JSON-able values.

A query's head is its last complete commit. Offsets are the sources' own JSON offsets
keyed by persistent id; an output's position says how much of it is committed, so
that a restart can cut off anything written after it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class OutputSnapshot:
    """A stored copy of an output's key → row state as of a committed batch."""

    batch: int
    position: int
    key: str
    """Where the snapshot lives in snapshot storage."""


@dataclass(frozen=True)
class StagedBatch:
    """The last committed batch of a JSON-lines output, as its driver staged it: the
    bytes that belong at ``start`` of the output, until they are there. A driver that
    dies between the commit and copying them in leaves the next one a way to redo it."""

    key: str
    """The staged file, relative to the output's folder."""
    start: int


@dataclass(frozen=True)
class OutputHead:
    position: int
    """Committed bytes of a JSON-lines file (or objects, on S3, or the Delta version)."""
    rows: int
    """Committed changelog rows (lines) in total."""
    snapshot: OutputSnapshot | None = None
    staged: StagedBatch | None = None

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> OutputHead:
        snapshot, staged = value.get("snapshot"), value.get("staged")
        return cls(
            position=int(value["position"]),
            rows=int(value["rows"]),
            snapshot=OutputSnapshot(**snapshot) if snapshot else None,
            staged=StagedBatch(**staged) if staged else None,
        )


@dataclass(frozen=True)
class QueryHead:
    """The last complete commit of one streaming query (one output)."""

    batch: int
    batch_time_ms: int
    commit_time_ms: int
    offsets: dict[str, Any] = field(default_factory=dict)
    """persistent_id → the source's offset at the end of the batch."""
    outputs: dict[str, OutputHead] = field(default_factory=dict)
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    """persistent_id → counters (rows read, malformed rows set aside)."""
    iterate: dict[str, Any] | None = None
    """The stored fixed point of an iterate operator feeding this query, if any."""

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> QueryHead:
        return cls(
            batch=int(value["batch"]),
            batch_time_ms=int(value["batch_time_ms"]),
            commit_time_ms=int(value["commit_time_ms"]),
            offsets=dict(value.get("offsets", {})),
            outputs={k: OutputHead.from_json(v) for k, v in value.get("outputs", {}).items()},
            sources={k: dict(v) for k, v in value.get("sources", {}).items()},
            iterate=value.get("iterate"),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def heads_from_record(record: dict[str, Any]) -> dict[str, QueryHead]:
    return {query: QueryHead.from_json(head) for query, head in record.get("heads", {}).items()}


def heads_to_json(heads: dict[str, QueryHead]) -> dict[str, Any]:
    return {query: head.to_json() for query, head in sorted(heads.items())}
