"""The durable order in which a file source admitted its input files.

Spark's offset for a file source is just a count: "the first N files of the index".
The index is a chain of segments in snapshot storage, each created put-if-absent and
named by the first file number it holds: ``sources/<persistent_id>/files/<start>.json``
holds the files numbered ``start..start+n-1``. Naming segments by their start is what makes
concurrent writers (several queries reading one source, or a driver being fenced) agree:
of two writers appending at the same position exactly one succeeds, and the other
reloads the chain and admits what is still new after it.
Files are named relative to the source's root, so the source may move to another
path (or another volume) without its files being read again.

Admission is append-only: a file listed once keeps its number forever, so replaying
a batch reads exactly the same files. With each file the index keeps how its source read it
then (``read_as``, opaque here; the source's format and parse options), so that replaying a
batch after the source's format changed (JSON lines earlier, CSV now) reads the same rows:
Spark replays a batch whose commit it had not recorded when the driver died, and its
stateful operators count what the replay reads. Segments written before ``read_as`` existed
have none; their files are read as the source reads now. Segments are merged into a ``base-<end>.json``
every ``COMPACT_AFTER`` segments to keep start-up reads short. Compaction deletes the
segments inside the base, which reopens their names: a slow writer whose view ended
there could create one again. So an admission counts only if no base covers its
segment; otherwise the writer reloads and admits after the base (the stray segment lies
inside the base, where loading never looks).

One index may serve several threads: a driver keeps one per source for all the queries that
read it, and their commits run at once on Spark's callback threads. Its view of the chain
is therefore changed under a lock, and a load builds a new view before it replaces the old
one, so no thread ever reads a view another thread is halfway through loading.
"""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

from spark_app.faults import IN_INDEX_COMPACTION, crash_point
from spark_app.storage import FileEntry, NotFound, Storage, join

COMPACT_AFTER = 64
_SEGMENT = re.compile(r"/files/(base-)?(\d{12})\.json$")


class IndexCorrupted(Exception):
    """The index's segments do not form one chain, or one is damaged (storage edited by hand?)."""


class _Vanished(Exception):
    """A listed segment was deleted before it could be read."""


_RELOAD_ATTEMPTS = 5
_READS_AT_ONCE = 8

class FileIndex:
    def __init__(self, storage: Storage, persistent_id: str, compact_after: int = 0) -> None:
        self._storage = storage
        self._compact_after = compact_after or COMPACT_AFTER
        self._prefix = join("sources", persistent_id, "files") + "/"
        self._files: list[FileEntry] = []
        self._read_as: list[str | None] = []
        self._known: set[str] = set()
        self._segments = 0
        self._loaded = False
        self._lock = threading.RLock()

    def __len__(self) -> int:
        with self._lock:
            self._ensure_loaded()
            return len(self._files)

    def files(self, start: int, end: int) -> list[FileEntry]:
        with self._lock:
            self._ensure_loaded()
            if end > len(self._files):
                self.reload()
            if end > len(self._files):
                raise IndexCorrupted(f"{self._prefix}: offset {end} is past the {len(self._files)} files indexed")
            return self._files[start:end]

    def read_as(self, start: int, end: int) -> list[str | None]:
        """How the source read files ``start..end-1`` when they were admitted (None: not recorded)."""
        with self._lock:
            self.files(start, end)  # loads, or fails, as files() does
            return self._read_as[start:end]

    def bounded_end(self, start: int, end: int, max_files: int, max_bytes: int) -> int:
        """Where a batch that starts at file ``start`` ends, at most ``end``: within
        ``max_files`` files and ``max_bytes`` bytes, but at least one file, so that a file
        larger than the limit is still read (alone)."""
        taken, total = 0, 0
        for entry in self.files(start, end):
            if taken and (taken >= max_files or total + entry.size > max_bytes):
                break
            taken += 1
            total += entry.size
        return start + taken

    def admit(self, listing: list[FileEntry], read_as: str | None = None) -> int:
        """Adds the files of ``listing`` not seen before, each recorded with ``read_as``;
        returns the new file count.

        New files are numbered by (mtime, path), so files that arrive together are read
        in the order they were written.
        """
        with self._lock:
            return self._admit(listing, read_as)

    def _admit(self, listing: list[FileEntry], read_as: str | None) -> int:
        self._ensure_loaded()
        while True:
            new = sorted((f for f in listing if f.path not in self._known), key=lambda f: (f.mtime_ms, f.path))
            if not new:
                return len(self._files)
            start, end = len(self._files), len(self._files) + len(new)
            body = _segment_body(start, new, [read_as] * len(new))
            if self._storage.create(self._segment_key(start), json.dumps(body).encode()) and \
                    self._covering_base(start) is None:
                self._extend(new, [read_as] * len(new))
                self._segments += 1
                if self._segments >= self._compact_after:
                    self._compact()
                return end
            self.reload()  # another writer admitted files first: take theirs, then retry

    def reload(self) -> None:
        with self._lock:
            for _ in range(_RELOAD_ATTEMPTS):
                try:
                    self._load()
                    return
                except _Vanished:
                    continue  # a concurrent compaction replaced what was listed: list again
        raise IndexCorrupted(f"{self._prefix}: segments kept vanishing while loading the file index")

    def _load(self) -> None:
        keys = self._storage.list(self._prefix)
        bases = sorted((int(m.group(2)), k) for k in keys if (m := _SEGMENT.search(k)) and m.group(1))
        segments = sorted((int(m.group(2)), k) for k in keys if (m := _SEGMENT.search(k)) and not m.group(1))
        base_end = bases[-1][0] if bases else 0
        # A file keeps its number for ever, so the view loaded before holds still: only what
        # was admitted after it is read (a query's commit reloads; on S3 each segment read is
        # a round trip, and up to COMPACT_AFTER of them wait between two compactions), or
        # the base, where one reaches past the view.
        files, read_as = (list(self._files), list(self._read_as)) if self._loaded else ([], [])
        base = bases[-1][1] if base_end > len(files) else None
        held = base_end if base else len(files)
        # The keys name where each segment starts, so what is needed is known from the
        # listing, and read at once: one round trip for the chain rather than one a segment.
        data = self._read_all(([base] if base else []) + [key for start, key in segments if start >= held])
        if base:
            files, read_as = self._parse_segment(base, data[base], expected_start=0)
        for start, key in segments:
            if start < len(files):
                continue  # held already, in the view or inside the base
            segment_files, segment_read_as = self._parse_segment(key, data[key], expected_start=len(files))
            files += segment_files
            read_as += segment_read_as
        self._files, self._read_as, self._known = files, read_as, {f.path for f in files}
        self._segments = sum(1 for start, _ in segments if start >= base_end)
        self._loaded = True

    def _covering_base(self, start: int) -> str | None:
        """A base that holds file ``start``: its segment was deleted, so creating it again
        succeeded, but it is not part of the chain."""
        for key in self._storage.list(self._prefix):
            match = _SEGMENT.search(key)
            if match and match.group(1) and int(match.group(2)) > start:
                return key
        return None

    def _read_all(self, keys: list[str]) -> dict[str, bytes]:
        if len(keys) < 2:
            return {key: self._read(key) for key in keys}
        with ThreadPoolExecutor(min(len(keys), _READS_AT_ONCE), thread_name_prefix="file-index-read") as pool:
            return dict(zip(keys, pool.map(self._read, keys), strict=True))

    def _read(self, key: str) -> bytes:
        try:
            return self._storage.read(key)
        except NotFound:
            raise _Vanished() from None

    @staticmethod
    def _parse_segment(key: str, data: bytes, expected_start: int) -> tuple[list[FileEntry], list[str | None]]:
        try:
            body = json.loads(data)
            files = [FileEntry(p, int(s), int(m)) for p, s, m in body["files"]]
            read_as = body.get("read_as") or [None] * len(files)
            start = body["start"]
            if len(read_as) != len(files):
                raise ValueError(f"{len(read_as)} read_as for {len(files)} files")
        except (ValueError, KeyError, TypeError) as error:
            raise IndexCorrupted(
                f"file index segment {key} is damaged ({len(data)} bytes; {error}); "
                "`python -m spark_app repair URI` removes it if no committed offset reaches into it"
            ) from None
        if start != expected_start:
            raise IndexCorrupted(f"{key} starts at file {start}, expected {expected_start}")
        return files, read_as

    def _extend(self, entries: list[FileEntry], read_as: list[str | None]) -> None:
        self._files.extend(entries)
        self._read_as.extend(read_as)
        self._known.update(f.path for f in entries)

    def _compact(self) -> None:
        end = len(self._files)
        body = _segment_body(0, self._files, self._read_as)
        self._storage.create(join(self._prefix, f"base-{end:012d}.json"), json.dumps(body).encode())
        crash_point(IN_INDEX_COMPACTION)
        for key in self._storage.list(self._prefix):
            match = _SEGMENT.search(key)
            if match is None:
                continue
            if int(match.group(2)) < end:  # older bases, and segments inside the new base
                self._storage.delete(key)
        self._segments = 0

    def _segment_key(self, start: int) -> str:
        return join(self._prefix, f"{start:012d}.json")

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self.reload()


def _segment_body(start: int, files: list[FileEntry], read_as: list[str | None]) -> dict[str, object]:
    body: dict[str, object] = {"start": start, "files": [[f.path, f.size, f.mtime_ms] for f in files]}
    if any(r is not None for r in read_as):
        # A key of its own, beside "files": a driver from before it existed reads the segment still.
        body["read_as"] = read_as
    return body
