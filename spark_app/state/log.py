"""The metadata log: an append-only sequence of small JSON records, one object each.

Entry ``n`` is written with put-if-absent, so of two drivers racing for the same ``n``
exactly one wins. A driver appends only at ``last_seen + 1``; finding that slot taken
means another driver wrote after it, which is how a driver learns it has been fenced
(see ``spark_app.state.session``). Every record carries the full current state (the
heads of all queries), so the newest entry alone describes the pipeline and old
entries can be deleted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from spark_app.storage import NotFound, Storage, join

PREFIX = "log/"
_ENTRY = re.compile(r"^log/(\d{12})\.json$")


@dataclass(frozen=True)
class LogEntry:
    seq: int
    record: dict[str, Any]


class LogConflict(Exception):
    """Another writer created the entry this writer wanted."""

    def __init__(self, existing: LogEntry) -> None:
        super().__init__(f"metadata log entry {existing.seq} was written by another driver")
        self.existing = existing


def entry_key(seq: int) -> str:
    return join(PREFIX, f"{seq:012d}.json")


class MetadataLog:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def sequence_numbers(self) -> list[int]:
        return sorted(int(m.group(1)) for k in self._storage.list(PREFIX) if (m := _ENTRY.match(k)))

    def latest(self) -> LogEntry | None:
        """The newest entry, or None for a pipeline that never started."""
        for seq in reversed(self.sequence_numbers()):
            entry = self.entry(seq)
            if entry is not None:
                return entry
        return None

    def entry(self, seq: int) -> LogEntry | None:
        try:
            return LogEntry(seq, json.loads(self._storage.read(entry_key(seq))))
        except NotFound:
            return None

    def exists(self, seq: int) -> bool:
        return self.entry(seq) is not None

    def append(self, seq: int, record: dict[str, Any]) -> LogEntry:
        """Writes ``record`` as entry ``seq``; raises ``LogConflict`` if that entry exists.

        ``record["nonce"]`` must be unique per call: a retried create whose first attempt
        did succeed finds its own bytes and counts as success.
        """
        record = {**record, "seq": seq}
        if self._storage.create(entry_key(seq), json.dumps(record, sort_keys=True).encode()):
            return LogEntry(seq, record)
        existing = self.entry(seq)
        if existing is None:  # deleted by compaction between our create and read: not ours
            raise LogConflict(LogEntry(seq, {}))
        if existing.record.get("nonce") == record.get("nonce"):
            return existing
        raise LogConflict(existing)

    def compact(self, keep: int) -> int:
        """Deletes all but the newest ``keep`` entries; returns how many were deleted."""
        numbers = self.sequence_numbers()
        doomed = numbers[:-keep] if keep > 0 else numbers
        for seq in doomed:
            self._storage.delete(entry_key(seq))
        return len(doomed)
