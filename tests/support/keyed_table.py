"""A keyed table in memory with every version and the changes between versions, read as
the backfill reads a Delta table (``spark_app.runtime.sources.backfill.TableView``), for
property tests against a plain recomputation."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from spark_app.runtime.sources.backfill import Behind, Changes, Chunk, Position

Row = tuple[int, str, int]
"""key, value, diff"""


class DictTable:
    """A keyed table whose every version is kept, with the changes between versions. A
    subclass may refuse versions (``readable``), as a compacted table does."""

    def __init__(self, rows: dict[int, str]) -> None:
        self.versions = [dict(rows)]
        self.changes_of: list[list[Row]] = [[]]

    def commit(self, upserts: dict[int, str], deletes: set[int]) -> None:
        current = dict(self.versions[-1])
        changes: list[Row] = []
        for key in sorted(deletes):
            if key in current:
                changes.append((key, current.pop(key), -1))
        for key, value in upserts.items():
            if key in current:
                changes.append((key, current[key], -1))
            changes.append((key, value, +1))
            current[key] = value
        self.versions.append(current)
        self.changes_of.append(changes)

    def readable(self, version: int, what: str) -> None:
        """Raises if ``what`` at ``version`` may not be read; every version may, here."""

    # ---- TableView ----
    def latest_version(self) -> int:
        return len(self.versions) - 1

    def changes(self, after: int, through: int, position: Position,
                behind: Behind | None = None) -> Changes[list[Row]]:
        since = after if behind is None else min(after, behind.version)
        self.readable(since + 1, "the changes of")
        forwarded, beyond = [], 0
        for version in range(since + 1, through + 1):
            for row in self.changes_of[version]:
                later = version > after
                ahead = behind is not None and after_position(row[0], position) \
                    and not after_position(row[0], behind.up_to)
                if (later and not after_position(row[0], position)) or ahead:
                    forwarded.append(row)
                beyond += row[2] * ((later and after_position(row[0], position)) - ahead)
        return Changes(forwarded, len(forwarded), beyond)

    def chunk(self, version: int, position: Position, limit: int) -> Chunk[list[Row]]:
        self.readable(version, "a chunk at")
        keys = sorted(k for k in self.versions[version] if after_position(k, position))[:limit]
        rows = [(k, self.versions[version][k], +1) for k in keys]
        return Chunk(rows, len(rows), json.dumps(keys[-1]) if keys else None)

    def count(self, version: int, position: Position) -> int:
        self.readable(version, "the count at")
        return sum(1 for k in self.versions[version] if after_position(k, position))

    def concat(self, parts: Sequence[list[Row]]) -> list[Row]:
        return [r for p in parts for r in p]


def after_position(key: int, position: Position) -> bool:
    if position.finished:
        return False
    return position.key is None or key > json.loads(position.key)


def fold(plans: Sequence[list[Row]]) -> dict[tuple[int, str], int]:
    """The rows handed over, with their diffs summed; rows summing to 0 left out."""
    total: Counter[tuple[int, str]] = Counter()
    for rows in plans:
        for key, value, diff in rows:
            total[(key, value)] += diff
    return {kv: n for kv, n in total.items() if n != 0}
