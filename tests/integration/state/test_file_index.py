from __future__ import annotations

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
