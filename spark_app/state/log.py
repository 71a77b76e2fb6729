"""The metadata log: an append-only sequence of small JSON records, one object each.

Entry ``n`` is written with put-if-absent, so of two drivers racing for the same ``n``
exactly one wins. A driver appends only at ``last_seen + 1``; finding that slot taken
means another driver wrote after it, which is how a driver learns it has been fenced
(see ``spark_app.state.session``). Every record carries the full current state (the
heads of all queries), so the newest entry alone describes the pipeline and old
entries can be deleted.

Deleting old entries reopens their slots: a driver frozen long enough for a newer one
to compact the log would find ``last_seen + 1`` free again. So an append counts only if
its entry is also the highest one: after the create, the log is listed, and an entry
with a higher number fences the writer. Its own entry stays: no reader takes a lower
entry for the newest, and compaction removes it later. (If the higher entry came after
the create, the newer driver may have resumed from it; the writer cannot tell, so it
stops without publishing anything, and the newer driver completes what it resumed.)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from spark_app.faults import IN_LOG_COMPACTION, crash_point
from spark_app.storage import NotFound, Storage, join

PREFIX = "log/"
_ENTRY = re.compile(r"^log/(\d{12})\.json$")


@dataclass(frozen=True)
class LogEntry:
    seq: int
    record: dict[str, Any]


class LogConflict(Exception):
    """Another writer created the entry this writer wanted, or one after it."""

    def __init__(self, existing: LogEntry) -> None:
        super().__init__(f"metadata log entry {existing.seq} was written by another driver")
        self.existing = existing


class LogCorrupted(Exception):
    """An entry of the metadata log is not a record (truncated or written by something else)."""

    def __init__(self, key: str, size: int, reason: str) -> None:
        super().__init__(
            f"metadata log entry {key} is damaged ({size} bytes; {reason}); "
            "`python -m spark_app inspect URI` shows the log, and `python -m spark_app repair URI` "
            "falls back to the previous good entry where that is safe"
        )
        self.key = key


def entry_key(seq: int) -> str:
    return join(PREFIX, f"{seq:012d}.json")


class MetadataLog:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def sequence_numbers(self) -> list[int]:
        return sorted(int(m.group(1)) for k in self._storage.list(PREFIX) if (m := _ENTRY.match(k)))

    def latest(self) -> LogEntry | None:
        """The newest entry, or None for a pipeline that never started."""
        return self.newest_after(0)

    def newest_after(self, seq: int) -> LogEntry | None:
        """The highest entry numbered above ``seq``, or None if there is none."""
        for number in reversed(self.sequence_numbers()):
            if number <= seq:
                return None
            entry = self.entry(number)
            if entry is not None:
                return entry
        return None

    def entry(self, seq: int) -> LogEntry | None:
        key = entry_key(seq)
        try:
            data = self._storage.read(key)
        except NotFound:
            return None
        try:
            record = json.loads(data)
        except ValueError as error:
            raise LogCorrupted(key, len(data), str(error)) from None
        if not isinstance(record, dict):
            raise LogCorrupted(key, len(data), "not a JSON object")
        return LogEntry(seq, record)

    def exists(self, seq: int) -> bool:
        return self.entry(seq) is not None

    def append(self, seq: int, record: dict[str, Any]) -> LogEntry:
        """Writes ``record`` as entry ``seq``; raises ``LogConflict`` if that entry exists.

        ``record["nonce"]`` must be unique per call: a retried create whose first attempt
        did succeed finds its own bytes and counts as success.
        """
        record = {**record, "seq": seq}
        if self._storage.create(entry_key(seq), json.dumps(record, sort_keys=True).encode()):
            entry = LogEntry(seq, record)
        else:
            existing = self.entry(seq)
            if existing is None:  # deleted by compaction between our create and read: not ours
                raise LogConflict(LogEntry(seq, {}))
            if existing.record.get("nonce") != record.get("nonce"):
                raise LogConflict(existing)
            entry = existing
        newer = self.newest_after(seq)
        if newer is not None:
            raise LogConflict(newer)
        return entry

    def compact(self, keep: int) -> int:
        """Deletes all but the newest ``keep`` entries; returns how many were deleted."""
        numbers = self.sequence_numbers()
        doomed = numbers[:-keep] if keep > 0 else numbers
        for number, seq in enumerate(doomed):
            if number == len(doomed) // 2:
                crash_point(IN_LOG_COMPACTION)
            self._storage.delete(entry_key(seq))
        return len(doomed)
