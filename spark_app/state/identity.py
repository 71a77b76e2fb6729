"""The identity of a pipeline's state, and which code changes it survives.

What is stored with the state: each source's persistent id, format, schema and path,
and for each query the ordered persistent ids it reads (Spark's checkpoint knows sources
only by position), its output key and a fingerprint of every stateful operator (its
kind, key and state schema). On restart the new identity is compared with the stored
one. Compatible changes keep the state: a new path or format for the same persistent
id, a new projection after the state, a new output. Incompatible ones are refused
before Spark starts, with a message that lists them and says how to reset.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from spark_app.state.tables import BACKFILL_FORMAT

RESET_HINT = (
    "To keep the old state, restore the previous code. To start from empty state, delete the "
    "state with `python -m spark_app reset {uri}` (or set spec.upgradeMode: stateless on the "
    "PersistentPipeline)."
)


@dataclass(frozen=True)
class SourceIdentity:
    persistent_id: str
    format: str
    schema: str
    path: str


@dataclass(frozen=True)
class QueryIdentity:
    query: str
    sources: tuple[str, ...]
    """Persistent ids in the order Spark numbers the query's sources."""
    stateful: tuple[str, ...]
    """One normalized signature per stateful operator, in plan order."""
    key: tuple[str, ...] | None
    """The output's key columns (update mode), or None for append-only outputs."""


@dataclass(frozen=True)
class Manifest:
    sources: dict[str, SourceIdentity] = field(default_factory=dict)
    queries: dict[str, QueryIdentity] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Manifest:
        return cls(
            sources={k: SourceIdentity(**v) for k, v in value.get("sources", {}).items()},
            queries={
                k: QueryIdentity(
                    query=v["query"],
                    sources=tuple(v["sources"]),
                    stateful=tuple(v["stateful"]),
                    key=tuple(v["key"]) if v.get("key") is not None else None,
                )
                for k, v in value.get("queries", {}).items()
            },
        )

    def digest(self) -> str:
        encoded = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(encoded).hexdigest()[:16]


@dataclass(frozen=True)
class Change:
    compatible: bool
    message: str


class IncompatibleChange(Exception):
    """The code changed in a way the stored state cannot follow."""

    def __init__(self, changes: list[Change], state_uri: str) -> None:
        lines = [f"the pipeline's code no longer matches its stored state at {state_uri}:"]
        lines += [f"  - {c.message}" for c in changes if not c.compatible]
        lines.append(RESET_HINT.format(uri=state_uri))
        super().__init__("\n".join(lines))
        self.changes = changes


def compare(stored: Manifest, new: Manifest, committed: set[str]) -> list[Change]:
    """Lists what changed between ``stored`` and ``new``.

    ``committed`` names the queries that have committed at least one batch; a query that
    never committed has no state to protect.
    """
    changes: list[Change] = []
    used_sources = {pid for q in committed if q in stored.queries for pid in stored.queries[q].sources}
    for pid in sorted(used_sources - new.sources.keys()):
        changes.append(Change(False, f"source {pid!r} has state but is no longer defined (removed or renamed)"))
    for pid in sorted(stored.sources.keys() & new.sources.keys()):
        changes.extend(_source_changes(stored.sources[pid], new.sources[pid]))
    for query in sorted(committed & stored.queries.keys()):
        if query not in new.queries:
            changes.append(Change(True, f"output {query!r} was removed; its state is kept but not used"))
            continue
        changes.extend(_query_changes(stored.queries[query], new.queries[query]))
    for query in sorted(new.queries.keys() - committed):
        if query not in stored.queries:
            changes.append(Change(True, f"output {query!r} is new and starts from the beginning of its sources"))
    return changes


def _source_changes(old: SourceIdentity, new: SourceIdentity) -> list[Change]:
    changes = []
    if old.path != new.path:
        kept = ("partitions it has offsets for carry on from them, new ones are read from their start"
                if _is_kafka(new.format) else
                "files already read there under the same relative names are not read again")
        changes.append(Change(True, f"source {old.persistent_id!r} now reads {new.path} (was {old.path}); {kept}"))
    if _is_kafka(old.format) != _is_kafka(new.format):
        # Spark's checkpoint holds a file source's offsets or a Kafka source's at this place.
        changes.append(Change(False, f"source {old.persistent_id!r} now reads {new.format} (was {old.format}): "
                                     "a file source and a Kafka source cannot take over each other's offsets"))
    elif {old.format, new.format} == {"table", BACKFILL_FORMAT}:
        # A shared table's changelog keeps Delta's offsets in Spark's checkpoint, its backfill a count of plans.
        changes.append(Change(False, f"source {old.persistent_id!r} now reads {new.format} (was {old.format}): "
                                     "a shared table read with backfill and one read without cannot take over "
                                     "each other's position"))
    elif old.format != new.format:
        changes.append(Change(True, f"source {old.persistent_id!r} now reads {new.format} (was {old.format})"))
    if old.schema != new.schema:
        changes.append(Change(True, f"source {old.persistent_id!r} schema is now {new.schema} (was {old.schema})"))
    return changes


def _is_kafka(source_format: str) -> bool:
    return source_format.split("/")[0] == "kafka"


def _query_changes(old: QueryIdentity, new: QueryIdentity) -> list[Change]:
    name = old.query
    if old.sources != new.sources:
        return [Change(False, f"output {name!r} now reads sources {list(new.sources)} "
                              f"but its state was built from {list(old.sources)} (order matters)")]
    changes = []
    if old.stateful != new.stateful:
        changes.append(Change(False, f"output {name!r} has different stateful operators: "
                                     f"stored {_describe(old.stateful)}, now {_describe(new.stateful)}"))
    if old.key != new.key:
        changes.append(Change(False, f"output {name!r} key is now {_describe(new.key)} (was {_describe(old.key)})"))
    return changes


def _describe(values: tuple[str, ...] | None) -> str:
    if values is None:
        return "none (append-only)"
    return "[" + "; ".join(values) + "]" if values else "none"
