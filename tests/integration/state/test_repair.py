"""Damaged state: a clear error naming the file, inspect shows it, repair falls back where safe."""

from __future__ import annotations

import json

import pytest

from spark_app.state.file_index import FileIndex, IndexCorrupted
from spark_app.state.inspect import inspect, render
from spark_app.state.log import LogCorrupted, MetadataLog, entry_key
from spark_app.state.repair import apply_repair, plan_repair
from spark_app.state.session import LEASE_KEY, LeaseDamaged, read_lease
from spark_app.storage import FileEntry, Storage
from tests.integration.state.sessions import Clock, head, open_session


def committed(storage: Storage, batches: int) -> None:
    session = open_session(storage, Clock(), epoch=1)
    for batch in range(batches):
        session.commit("out", head(batch))
        storage.write(f"checkpoints/out/offsets/{batch}", b"v1\n{}\n" + json.dumps({"source": "words", "files": batch + 1}).encode())
        storage.write(f"checkpoints/out/commits/{batch}", b"v1\n{}")


def test_a_damaged_newest_entry_is_named_and_repair_falls_back_to_the_previous_one(storage: Storage) -> None:
    committed(storage, 3)
    newest = MetadataLog(storage).sequence_numbers()[-1]
    storage.write(entry_key(newest), b'{"kind": "commit", "heads": {"out": {"ba')  # truncated
    with pytest.raises(LogCorrupted, match=f"metadata log entry {entry_key(newest)} is damaged .*spark_app repair"):
        MetadataLog(storage).latest()
    report = inspect(storage)
    assert report["queries"]["out"]["batch"] == 1
    assert "DAMAGED log/" in render(report)
    plan = plan_repair(storage, storage)
    assert plan.safe
    # Spark runs batch 2 again: its commit goes, its offsets stay (the same files are read).
    assert plan.remove_snapshots == ["checkpoints/out/commits/2"]
    apply_repair(storage, storage, plan)
    assert MetadataLog(storage).latest().record["heads"]["out"]["batch"] == 1  # type: ignore[union-attr]
    assert storage.list("repairs/") != []
    assert open_session(storage, Clock(), epoch=2).heads["out"] == head(1)


def test_a_damaged_lease_is_named_ignored_by_drivers_and_removed_by_repair(storage: Storage) -> None:
    committed(storage, 1)
    storage.write(LEASE_KEY, b"{not json")
    with pytest.raises(LeaseDamaged, match="lease.json is damaged"):
        read_lease(storage)
    assert open_session(storage, Clock()).epoch == 2  # the log, not the lease, decides
    storage.write(LEASE_KEY, b"{not json")
    plan = plan_repair(storage, storage)
    assert plan.safe and plan.remove_metadata == [LEASE_KEY]
    apply_repair(storage, storage, plan)
    assert read_lease(storage) is None


def test_a_damaged_index_segment_is_removed_only_if_no_offset_reaches_into_it(storage: Storage) -> None:
    committed(storage, 1)  # offsets reach 1 file of "words"
    index = FileIndex(storage, "words")
    index.admit([FileEntry("a.csv", 1, 1)])
    index.admit([FileEntry("b.csv", 1, 2)])
    storage.write("sources/words/files/000000000001.json", b"{trunc")
    with pytest.raises(IndexCorrupted, match="000000000001.json is damaged"):
        FileIndex(storage, "words").files(0, 2)
    plan = plan_repair(storage, storage)
    assert plan.safe
    apply_repair(storage, storage, plan)
    assert FileIndex(storage, "words").admit([FileEntry("a.csv", 1, 1), FileEntry("b.csv", 1, 2)]) == 2

    storage.write("sources/words/files/000000000000.json", b"{trunc")
    plan = plan_repair(storage, storage)
    assert not plan.safe
    assert "offsets reach file 1, inside it" in plan.damage[0].fix
