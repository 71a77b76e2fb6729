"""The key → row state behind a keyed output's changelog, kept in a local SQLite file.

A query in update mode hands its sink the new value of every changed key. Turning that
into a changelog (-1 of the old row, +1 of the new) needs the row last emitted for each
key. That state lives in a SQLite file on the driver's local disk; its durability comes
from two places, as with Spark's RocksDB state store: the output's own committed lines
are its changelog, and a snapshot of the file is stored at most every snapshot
interval. A restart loads the newest snapshot and replays the lines written after it.

A snapshot is taken off the batches' path (``Snapshotter``): the file is in SQLite's
write-ahead-log mode, so a second connection reads the state as it was at one commit
while the next batches go on writing, and copies and uploads it in a thread of its own.
At 16M keys the file is a gigabyte, which took 5 s of every snapshot interval's batch
when it was copied and stored in line.

A snapshot is stored compressed (zstd), which a key ending in ``.zst`` says; a snapshot of
an older driver, stored whole, is restored as it is. The state is JSON text, keys in order:
a file of ``bench/resume``'s shape at 16M keys (924 MB) compressed to 26 MB in 1.7 s of
one core (the GIL released) and was expanded in 0.8 s. Stored whole, its download from
the local S3 server took 23 s of a 37 s resume (2026-12-02; 20 s with it compressed).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

import pyarrow as pa

from spark_app.runtime.scratch import owned_folder
from spark_app.state.records import OutputSnapshot
from spark_app.storage import Storage

log = logging.getLogger("spark_app")


_KEY_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)
"""A key's text: the JSON array of its columns' values. One encoder, built once (json.dumps
builds one per call when given settings, a third of a replay's time)."""


def encode_key(values: list[Any]) -> str:
    if len(values) == 1 and type(values[0]) is str:
        # The common key, one text column: what the encoder writes for it (the same C
        # function escapes it), at a fifth of the encoder's cost, which a replay pays per line.
        return "[" + encode_basestring_ascii(values[0]) + "]"
    return _KEY_ENCODER.encode(values)


COMPRESSED = ".zst"
"""The end of a snapshot's key when it is stored compressed."""

_CODEC = "zstd"
_CHUNK = 1 << 20
"""Bytes read at a time when compressing or expanding a snapshot (1 MiB wrote the
expanded 220 MB file of 4M keys sooner than 8 or 64 MiB: 0.41 s against 1.19 and 0.80 s)."""


def compress_file(source: str, target: str) -> None:
    with pa.OSFile(source, "rb") as raw, pa.CompressedOutputStream(pa.OSFile(target, "wb"), _CODEC) as out:
        while (chunk := raw.read_buffer(_CHUNK)).size:
            out.write(chunk)


def expand_file(source: str, target: str) -> None:
    with pa.CompressedInputStream(pa.OSFile(source, "rb"), _CODEC) as packed, pa.OSFile(target, "wb") as out:
        while (chunk := packed.read_buffer(_CHUNK)).size:
            out.write(chunk)


_REPLAY_BLOCK = 100_000
"""Keys folded in memory before a replay writes them."""


_DECODE = json.JSONDecoder().decode
"""json.loads without its per-call checks (given bytes, it first guesses their encoding in Python)."""


def _row_of(text: str, record: dict[str, Any], time_ms: Any, diff: Any) -> str:
    """The row a changelog line holds, as the encoder wrote it: sinks.changelog.line
    appends ``"time"`` and ``"diff"`` last to the row's JSON object. A line written any
    other way (by hand) is encoded again."""
    ending = f',"time":{time_ms},"diff":{diff}}}'
    if text.endswith(ending):
        return text[: -len(ending)] + "}"
    if not record:
        return "{}"
    return json.dumps(record, separators=(",", ":"))


class OutputState:
    def __init__(self, key_columns: Sequence[str]) -> None:
        self._key_columns = tuple(key_columns)
        self._folder, self._lock = owned_folder("output")
        self._path = os.path.join(self._folder, "state.sqlite")
        self._db = self._connect(self._path)

    @staticmethod
    def _connect(path: str) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # Write-ahead log: a snapshot reads the state as of one commit while batches write on.
        # Durability comes from snapshots and the changelog, so nothing is synced.
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")
        # WITHOUT ROWID: the key is the table's own index, not stored a second time in an
        # index beside it (a quarter of the file, and of every snapshot, at 16M keys). A
        # snapshot of an older driver keeps its own table, which the same statements use.
        db.execute("CREATE TABLE IF NOT EXISTS rows (key TEXT PRIMARY KEY, row TEXT NOT NULL) WITHOUT ROWID")
        return db

    def key_of(self, row: dict[str, Any]) -> str:
        return encode_key([row.get(c) for c in self._key_columns])

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
        """Replays committed changelog lines (rows with time and diff); returns how many.

        A restart replays every line written since the last snapshot, up to a snapshot
        interval's worth: they are folded in memory a block at a time (the last change of
        a key wins) and written in bulk, and each row is kept as the encoder wrote it (the
        line without its time and diff), not encoded again."""
        count = 0
        folded: dict[str, str | None] = {}
        columns = self._key_columns  # key_of's work, inline: its call cost about 1 s a million lines
        self.begin()
        for line in lines:
            text = (line.decode() if isinstance(line, bytes) else line).rstrip("\n")
            record = _DECODE(text)
            time_ms = record.pop("time", None)
            diff = record.pop("diff")
            folded[encode_key([record.get(c) for c in columns])] = (
                _row_of(text, record, time_ms, diff) if diff > 0 else None)
            count += 1
            if len(folded) >= _REPLAY_BLOCK:
                self._write_folded(folded)
        self._write_folded(folded)
        self.commit()
        return count

    def _write_folded(self, folded: dict[str, str | None]) -> None:
        # In key order: SQLite then walks its index forwards instead of hopping about it
        # (bench/resume/replay.py, 1.1M lines into a state of 1M keys: 9.1 s against 12.3 s).
        items = sorted(folded.items())
        self.delete(k for k, row in items if row is None)
        self.upsert((k, row) for k, row in items if row is not None)
        folded.clear()

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM rows").fetchone()[0])

    def reading_point(self) -> sqlite3.Connection:
        """A second connection that reads the committed state as it is now, whatever is
        written after: its read transaction is open until it is closed."""
        reader = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        reader.execute("BEGIN")
        reader.execute("SELECT 1 FROM rows LIMIT 1").fetchall()  # a read transaction starts at its first read
        return reader

    def snapshot_to(self, path: str, reader: sqlite3.Connection | None = None) -> None:
        """Writes a consistent copy of the committed state (as of ``reader``'s reading
        point, or now) to ``path``."""
        source = reader or self._db
        if os.path.exists(path):
            os.unlink(path)
        target = sqlite3.connect(path)
        try:
            source.backup(target)  # one step: the copy is of one moment, not of several
        finally:
            target.close()

    def restore_from(self, snapshots: Storage, key: str) -> None:
        """Replaces the state by the snapshot stored at ``key`` (downloaded, not read into
        memory, and expanded if it is compressed); raises ``NotFound``."""
        downloaded = os.path.join(self._folder, "restoring.sqlite")
        if key.endswith(COMPRESSED):
            packed = downloaded + COMPRESSED
            try:
                snapshots.read_file(key, packed)
                expand_file(packed, downloaded)
            finally:
                if os.path.exists(packed):
                    os.unlink(packed)
        else:
            snapshots.read_file(key, downloaded)
        self._db.close()
        for stale in (self._path + "-wal", self._path + "-shm"):
            if os.path.exists(stale):
                os.unlink(stale)
        os.replace(downloaded, self._path)
        self._db = self._connect(self._path)

    @property
    def folder(self) -> str:
        """A private folder on the driver's local disk, removed with the state."""
        return self._folder

    def close(self) -> None:
        self._db.close()
        shutil.rmtree(self._folder, ignore_errors=True)  # a snapshot thread may still be writing in it
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1


class Snapshotter:
    """Takes an output state's snapshots off the batches' path, one at a time.

    ``start`` is called between batches, right after a commit: it opens the state's
    reading point there, so the snapshot holds exactly the batches committed so far. A
    thread copies that state into a local file and uploads it; ``finished`` hands the
    stored snapshot over once, for the next commit to name it. A snapshot no commit ever
    names (the driver stopped first) is never loaded: a restart reads the committed head.
    """

    def __init__(self, output: str) -> None:
        self._output = output
        self._thread: threading.Thread | None = None
        self._done: OutputSnapshot | None = None
        self._failed: BaseException | None = None

    def start(self, state: OutputState, snapshots: Storage, snapshot: OutputSnapshot) -> bool:
        """Begins storing ``snapshot`` of ``state`` unless one is under way; returns whether it did.
        It is stored compressed, so its key must say so (end in ``COMPRESSED``)."""
        if not snapshot.key.endswith(COMPRESSED):
            raise ValueError(f"a snapshot is stored compressed; its key must end in {COMPRESSED}: {snapshot.key}")
        if self._thread is not None:
            return False
        reader = state.reading_point()
        copy = os.path.join(state.folder, f"snapshot-{snapshot.batch}.sqlite")
        packed = copy + COMPRESSED

        def run() -> None:
            try:
                try:
                    state.snapshot_to(copy, reader)
                finally:
                    reader.close()  # the write-ahead log can be folded in again
                compress_file(copy, packed)
                os.unlink(copy)  # the whole copy (a gigabyte at 16M keys) need not wait for the upload
                snapshots.write_file(snapshot.key, packed)
                self._done = snapshot
            except BaseException as error:  # noqa: BLE001 - reported by finished(); a later snapshot tries again
                self._failed = error
            finally:
                for local in (copy, packed):
                    if os.path.exists(local):
                        os.unlink(local)

        self._thread = threading.Thread(target=run, name=f"spark_app-snapshot-{self._output}", daemon=True)
        self._thread.start()
        return True

    def finished(self) -> OutputSnapshot | None:
        """The snapshot stored since the last call, if one is; None while one is under way."""
        if self._thread is None or self._thread.is_alive():
            return None
        self._thread = None
        done, failed = self._done, self._failed
        self._done = self._failed = None
        if failed is not None:
            log.warning("output %s: a snapshot could not be stored (%s); the next one is tried at the next "
                        "interval", self._output, failed)
        return done

    def wait(self, timeout_s: float) -> None:
        """Lets a snapshot under way finish (tests, and a stop that wants it)."""
        if self._thread is not None:
            self._thread.join(timeout_s)
