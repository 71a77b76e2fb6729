"""The key → row state behind a keyed output's changelog, kept in a local SQLite file.

A query in update mode hands its sink the new value of every changed key. Turning that
into a changelog (-1 of the old row, +1 of the new) needs the row last emitted for each
key. That state lives in a SQLite file on the driver's local disk; its durability comes
from two places, as with Spark's RocksDB state store: the output's own committed lines
are its changelog, and a snapshot of the file is stored at most every snapshot
interval. A restart loads the newest snapshot and replays the lines written after it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any


class OutputState:
    def __init__(self, key_columns: Sequence[str]) -> None:
        self._key_columns = tuple(key_columns)
        self._folder = tempfile.mkdtemp(prefix="spark_app-output-")
        self._path = os.path.join(self._folder, "state.sqlite")
        self._db = self._connect(self._path)

    @staticmethod
    def _connect(path: str) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=OFF")  # durability comes from snapshots and the changelog
        db.execute("PRAGMA synchronous=OFF")
        db.execute("CREATE TABLE IF NOT EXISTS rows (key TEXT PRIMARY KEY, row TEXT NOT NULL)")
        return db

    def key_of(self, row: dict[str, Any]) -> str:
        return json.dumps([row.get(c) for c in self._key_columns], default=str, separators=(",", ":"))

    def begin(self) -> None:
        self._db.execute("BEGIN")

    def commit(self) -> None:
        self._db.execute("COMMIT")

    def rollback(self) -> None:
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def lookup(self, keys: Iterable[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        batch = list(keys)
        for start in range(0, len(batch), 500):
            chunk = batch[start : start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(self._db.execute(f"SELECT key, row FROM rows WHERE key IN ({marks})", chunk).fetchall())
        return found

    def upsert(self, items: Iterable[tuple[str, str]]) -> None:
        self._db.executemany("INSERT OR REPLACE INTO rows (key, row) VALUES (?, ?)", items)

    def delete(self, keys: Iterable[str]) -> None:
        self._db.executemany("DELETE FROM rows WHERE key = ?", ((k,) for k in keys))

    def apply_changelog(self, lines: Iterable[bytes]) -> int:
        """Replays committed changelog lines (rows with time and diff); returns how many."""
        count = 0
        self.begin()
        for line in lines:
            record = json.loads(line)
            record.pop("time", None)
            diff = record.pop("diff")
            key = self.key_of(record)
            if diff > 0:
                self.upsert([(key, json.dumps(record, separators=(",", ":")))])
            else:
                self.delete([key])
            count += 1
        self.commit()
        return count

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM rows").fetchone()[0])

    def snapshot(self) -> bytes:
        """A consistent copy of the committed state."""
        copy_path = os.path.join(self._folder, "snapshot.sqlite")
        if os.path.exists(copy_path):
            os.unlink(copy_path)
        target = sqlite3.connect(copy_path)
        try:
            self._db.backup(target)
        finally:
            target.close()
        with open(copy_path, "rb") as handle:
            data = handle.read()
        os.unlink(copy_path)
        return data

    def restore(self, data: bytes) -> None:
        self._db.close()
        with open(self._path, "wb") as handle:
            handle.write(data)
        self._db = self._connect(self._path)

    def close(self) -> None:
        self._db.close()
        for name in os.listdir(self._folder):
            os.unlink(os.path.join(self._folder, name))
        os.rmdir(self._folder)
