from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from spark_app.state import file_index
from spark_app.state.file_index import FileIndex, IndexCorrupted
from spark_app.storage import FileEntry, Storage


def entry(path: str, mtime: int) -> FileEntry:
    return FileEntry(path, 10, mtime)


def test_files_are_numbered_once_in_order_of_arrival(storage: Storage) -> None:
    index = FileIndex(storage, "src")
    assert index.admit([entry("b.csv", 2), entry("a.csv", 1)]) == 2
    assert index.admit([entry("b.csv", 2), entry("a.csv", 1), entry("c.csv", 0)]) == 3
    assert [f.path for f in index.files(0, 3)] == ["a.csv", "b.csv", "c.csv"]
    reloaded = FileIndex(storage, "src")
    assert [f.path for f in reloaded.files(1, 3)] == ["b.csv", "c.csv"]


def test_a_second_index_writer_sees_the_first_ones_files(storage: Storage) -> None:
    first, second = FileIndex(storage, "src"), FileIndex(storage, "src")
    first.admit([entry("a.csv", 1)])
    assert second.admit([entry("a.csv", 1), entry("b.csv", 2)]) == 2
    assert [f.path for f in second.files(0, 2)] == ["a.csv", "b.csv"]


def test_a_stale_writer_cannot_fork_the_chain(storage: Storage) -> None:
    # Two queries read one source: each admits through its own index, loaded at different times.
    first, second = FileIndex(storage, "src"), FileIndex(storage, "src")
    first.admit([entry("a.csv", 1)])
    second.admit([entry("a.csv", 1), entry("b.csv", 2), entry("c.csv", 3)])
    assert first.admit([entry("a.csv", 1), entry("d.csv", 4)]) == 4  # stale: it never saw b and c
    expected = ["a.csv", "b.csv", "c.csv", "d.csv"]
    assert [f.path for f in FileIndex(storage, "src").files(0, 4)] == expected
    assert [f.path for f in second.files(0, 4)] == expected


def test_compaction_keeps_every_file(storage: Storage, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(file_index, "COMPACT_AFTER", 3)
    index = FileIndex(storage, "src")
    for i in range(10):
        index.admit([entry(f"f{i:02d}.csv", i)])
    assert len(storage.list("sources/src/files/")) < 10
    assert [f.path for f in FileIndex(storage, "src").files(0, 10)] == [f"f{i:02d}.csv" for i in range(10)]


def test_an_offset_past_the_index_is_an_error(storage: Storage) -> None:
    index = FileIndex(storage, "src")
    index.admit([entry("a.csv", 1)])
    with pytest.raises(IndexCorrupted):
        index.files(0, 5)


def test_a_slow_writer_cannot_fork_the_chain_after_compaction(storage: Storage, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A slow reader of the same source loaded the chain before another one admitted and
    compacted it: compaction deleted the slot the slow reader appends at."""
    monkeypatch.setattr(file_index, "COMPACT_AFTER", 3)
    slow, fast = FileIndex(storage, "src"), FileIndex(storage, "src")
    assert slow.admit([entry("a.csv", 1)]) == 1
    for i in range(2, 6):
        fast.admit([entry(f"f{i}.csv", i)])
    assert slow.admit([entry("a.csv", 1), entry("late.csv", 9)]) == 6
    chain = [f.path for f in FileIndex(storage, "src").files(0, 6)]
    assert chain == ["a.csv", "f2.csv", "f3.csv", "f4.csv", "f5.csv", "late.csv"]
    assert [f.path for f in slow.files(0, 6)] == chain


def test_a_batch_is_bounded_by_files_and_bytes_but_always_moves(storage: Storage) -> None:
    index = FileIndex(storage, "src")
    index.admit([FileEntry(f"f{i}.csv", size, i) for i, size in enumerate([10, 10, 10, 500, 10, 10])])
    assert index.bounded_end(0, 6, max_files=2, max_bytes=1000) == 2
    assert index.bounded_end(2, 6, max_files=10, max_bytes=100) == 3  # f3 would pass the bytes
    assert index.bounded_end(3, 6, max_files=10, max_bytes=100) == 4  # alone over the limit: still read
    assert index.bounded_end(4, 6, max_files=10, max_bytes=100) == 6
    assert index.bounded_end(6, 6, max_files=10, max_bytes=100) == 6


class _Latent:
    """The storage with a millisecond of latency on every call, as over a network: long
    enough for Python to switch threads inside any operation of the index."""

    def __init__(self, inner: Storage) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        operation = getattr(self._inner, name)

        def latent(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.001)
            return operation(*args, **kwargs)
        return latent


def _in_threads(work: Any, threads: int = 3) -> list[str]:
    errors: list[str] = []

    def run() -> None:
        try:
            work()
        except Exception as error:  # noqa: BLE001 - each thread's failure is the test's finding
            errors.append(repr(error))
    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(60)
    return errors


def test_one_index_serves_the_commits_of_several_queries_at_once(storage: Storage) -> None:
    """A driver keeps one index per source for every query reading it, and Spark commits
    the queries' batches on threads of their own (CI once saw one query's commit find
    "offset 5 past the 3 files indexed" while the other query's commit was reloading)."""
    writer = FileIndex(storage, "src")
    for i in range(6):
        writer.admit([entry(f"f{i}.csv", i)])
    expected = [f"f{i}.csv" for i in range(6)]
    shared = FileIndex(_Latent(storage), "src")  # type: ignore[arg-type]
    seen: list[list[str]] = []

    def commits() -> None:
        for _ in range(15):
            seen.append([f.path for f in shared.files(0, 6)])
            shared.reload()

    assert _in_threads(commits) == []
    assert all(view == expected for view in seen)


def test_one_index_admitting_from_several_threads_numbers_each_file_once(storage: Storage) -> None:
    shared = FileIndex(_Latent(storage), "src", compact_after=3)  # type: ignore[arg-type]
    listing = [entry(f"f{i:02d}.csv", i) for i in range(12)]
    step = iter(range(1, 13))
    lock = threading.Lock()

    def admissions() -> None:
        while True:
            with lock:
                n = next(step, None)
            if n is None:
                return
            shared.admit(listing[:n])

    assert _in_threads(admissions) == []
    assert [f.path for f in FileIndex(storage, "src").files(0, 12)] == [f.path for f in listing]
    assert len(shared) == 12


def test_each_file_keeps_how_its_source_read_it_through_reloads_and_compaction(storage: Storage) -> None:
    index = FileIndex(storage, "src", compact_after=2)
    index.admit([entry("a.jsonl", 1)], read_as="json")
    index.admit([entry("a.jsonl", 1), entry("b.csv", 2)], read_as="csv")  # a compaction into one base
    index.admit([entry("c.csv", 3)])  # a writer that records nothing
    assert index.read_as(0, 3) == ["json", "csv", None]
    reloaded = FileIndex(storage, "src", compact_after=2)
    assert [f.path for f in reloaded.files(0, 3)] == ["a.jsonl", "b.csv", "c.csv"]
    assert reloaded.read_as(1, 3) == ["csv", None]
    assert any("base-" in key for key in storage.list("sources/src/files/"))


def test_a_segment_from_before_read_as_reads_as_unrecorded(storage: Storage) -> None:
    storage.create("sources/src/files/000000000000.json", b'{"start": 0, "files": [["a.csv", 10, 1]]}')
    index = FileIndex(storage, "src")
    assert index.read_as(0, 1) == [None]
    assert index.admit([entry("a.csv", 1), entry("b.csv", 2)], read_as="csv") == 2
    assert FileIndex(storage, "src").read_as(0, 2) == [None, "csv"]


class _Counted:
    """The storage, with the keys it was asked to read."""

    def __init__(self, inner: Storage) -> None:
        self._inner = inner
        self.reads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read(self, key: str) -> bytes:
        self.reads.append(key.rsplit("/", 1)[-1])
        return self._inner.read(key)


def test_a_reload_reads_only_what_was_admitted_since_the_view_was_loaded(storage: Storage) -> None:
    """A query's commit reloads the index its source admitted through: on S3 each segment
    read is a round trip, and between two compactions up to COMPACT_AFTER segments lie in
    the chain."""
    writer = FileIndex(storage, "src", compact_after=4)
    for i in range(3):
        writer.admit([entry(f"f{i}.csv", i)])
    counted = _Counted(storage)
    commits = FileIndex(counted, "src", compact_after=4)  # type: ignore[arg-type]
    assert [f.path for f in commits.files(0, 3)] == ["f0.csv", "f1.csv", "f2.csv"]
    assert sorted(counted.reads) == ["000000000000.json", "000000000001.json", "000000000002.json"]

    counted.reads.clear()
    writer.admit([entry("f3.csv", 3)])  # the writer compacts: base-000000000004 holds all four
    writer.admit([entry("f4.csv", 4)])
    assert [f.path for f in commits.files(3, 5)] == ["f3.csv", "f4.csv"]
    assert sorted(counted.reads) == ["000000000004.json", "base-000000000004.json"]  # the base reaches past the view

    counted.reads.clear()
    writer.admit([entry("f5.csv", 5)])
    assert [f.path for f in commits.files(0, 6)] == [f"f{i}.csv" for i in range(6)]
    assert counted.reads == ["000000000005.json"]
    commits.reload()
    assert counted.reads == ["000000000005.json"]  # nothing new: a listing, no read


class _Gathered:
    """The storage, each of whose reads waits until ``together`` reads are under way."""

    def __init__(self, inner: Storage, together: int) -> None:
        self._inner = inner
        self._barrier = threading.Barrier(together, timeout=10)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read(self, key: str) -> bytes:
        self._barrier.wait()  # broken (an error) when the reads come one after another
        return self._inner.read(key)


def test_a_load_reads_the_base_and_the_segments_of_the_chain_at_once(storage: Storage) -> None:
    """A new driver, and each of its Python source processes, loads the whole chain: up
    to COMPACT_AFTER segments and a base, each a round trip on S3."""
    writer = FileIndex(storage, "src", compact_after=3)
    for i in range(8):
        writer.admit([entry(f"f{i}.csv", i)])  # a base of f0 to f5, then the segments of f6 and f7
    reader = FileIndex(_Gathered(storage, together=3), "src", compact_after=3)  # type: ignore[arg-type]
    assert [f.path for f in reader.files(0, 8)] == [f"f{i}.csv" for i in range(8)]
