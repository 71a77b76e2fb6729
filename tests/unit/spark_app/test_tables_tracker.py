"""A shared table's changelog input as its query's commit sees it: caught up once no
version after its committed Delta offset changed data (versions that only rearrange files,
the compaction's OPTIMIZE, do not count: the stream never moves past them)."""

from __future__ import annotations

import json
from pathlib import Path

from spark_app.runtime.tables.changelog import END_INDEX, ChangelogTracker
from spark_app.state.delta_log import commit_key
from spark_app.storage import FilesystemStorage


def commit(storage: FilesystemStorage, version: int, *, data: bool, files: int = 1) -> None:
    actions = [{"commitInfo": {"timestamp": version, "operation": "MERGE" if data else "OPTIMIZE"}},
               *({"add": {"path": f"part-{version}-{n}.parquet", "dataChange": data}} for n in range(files))]
    storage.write(commit_key(version), "\n".join(json.dumps(a) for a in actions).encode())


def offset(version: int, index: int, snapshot: bool = False) -> dict[str, object]:
    return {"sourceVersion": 1, "reservoirId": "t", "reservoirVersion": version, "index": index,
            "isStartingVersion": snapshot}


def test_caught_up_means_no_unread_version_changed_data(tmp_path: Path) -> None:
    storage = FilesystemStorage(str(tmp_path))
    tracker = ChangelogTracker(storage)
    assert tracker.caught_up(None)  # no table yet: nothing to read
    for version in range(3):
        commit(storage, version, data=True)
    assert not tracker.caught_up(None)
    assert tracker.caught_up(offset(2, END_INDEX))
    assert tracker.caught_up(offset(2, END_INDEX, snapshot=True))  # the snapshot of the latest, read whole
    assert not tracker.caught_up(offset(1, END_INDEX))
    assert tracker.caught_up(offset(2, 0))  # the index of the latest version's last (only) file
    assert not tracker.caught_up(offset(2, 0, snapshot=True))  # part of its contents
    assert not tracker.caught_up(offset(2, -1))
    commit(storage, 3, data=False)  # a compaction's OPTIMIZE: Delta's offset stays at version 2
    assert tracker.caught_up(offset(2, END_INDEX))
    assert tracker.caught_up(offset(3, -1))
    commit(storage, 4, data=True, files=3)
    assert not tracker.caught_up(offset(2, END_INDEX))
    assert not tracker.caught_up(offset(4, 1)) and tracker.caught_up(offset(4, 2))
    assert tracker.caught_up(offset(5, -1))
    assert tracker.describe(offset(4, END_INDEX, snapshot=True)) == "snapshot of version 4"
    assert tracker.counters({}, None, offset(4, 3)) == {"version": 4}


def test_a_reader_behind_the_log_is_not_caught_up(tmp_path: Path) -> None:
    storage = FilesystemStorage(str(tmp_path))
    for version in (5, 6):  # versions 0 to 4 compacted away
        commit(storage, version, data=True)
    assert not ChangelogTracker(storage).caught_up(offset(2, END_INDEX))
