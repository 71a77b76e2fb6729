"""What the iterate store does with storage alone, on every backend: row counts from the
Delta log, the locations a commit names, and deleting what no commit names."""

import json
from unittest.mock import Mock, patch

from pyspark.sql.types import StructType

from spark_app.runtime.iterate.store import IterateStore, TableRef, locations, log_refs
from spark_app.storage import Storage


def _commit(*actions: dict) -> bytes:
    return "\n".join(json.dumps(action) for action in actions).encode()


def store(storage: Storage, epoch: int = 3) -> IterateStore:
    return IterateStore(None, storage, "cc", epoch)  # type: ignore[arg-type] # storage alone needs no Spark


def test_the_rows_of_a_written_version_come_from_the_metrics_of_its_commit(storage: Storage) -> None:
    log = "iterate/cc/contents/edges/e000003-0a0b0c0d/_delta_log/"
    storage.write(log + "00000000000000000000.json", _commit(
        {"commitInfo": {"operation": "WRITE", "operationMetrics": {"numFiles": "2", "numOutputRows": "999995"}}},
        {"add": {"path": "part-00000.parquet", "size": 10}},
    ))
    assert store(storage).written_rows(TableRef("contents/edges/e000003-0a0b0c0d", 0), StructType()) == 999_995


def test_a_commit_without_metrics_is_counted_by_reading_the_version(storage: Storage) -> None:
    ref = TableRef("contents/edges/e000003-0a0b0c0d", 0)
    storage.write(f"iterate/cc/{ref.at}/_delta_log/00000000000000000000.json",
                  _commit({"commitInfo": {"operation": "WRITE"}}, {"add": {"path": "part-00000.parquet"}}))
    s = store(storage)
    read = Mock(return_value=Mock(count=Mock(return_value=12)))
    with patch.object(s, "read", read):
        assert s.written_rows(ref, StructType()) == 12
    read.assert_called_once_with(ref, StructType())


def test_commits_from_before_locations_name_the_fixed_place_of_each_table() -> None:
    assert TableRef.from_json(4, "result", "labels") == TableRef("result/labels", 4)
    assert log_refs(7, "edges") == [TableRef("inputs/edges", 7)]
    assert log_refs([{"at": "inputs/edges/e000002-00000000", "version": 1}], "edges") == [
        TableRef("inputs/edges/e000002-00000000", 1)]


VERSIONS = {
    "inputs": {"edges": [{"at": "inputs/edges/e000001-11111111", "version": 5},
                         {"at": "inputs/edges/e000002-22222222", "version": 0}],
               "weights": {"at": "inputs/weights/e000002-33333333", "version": 0}},
    "contents": {"edges": {"snapshot": {"at": "contents/edges/e000001-44444444", "version": 0}, "rows": 9,
                           "logged": 1}},
    "result": {"labels": 3},  # from before locations
}


def test_a_commit_names_the_locations_of_everything_it_consists_of() -> None:
    assert locations(VERSIONS) == {"inputs/edges/e000001-11111111", "inputs/edges/e000002-22222222",
                                   "inputs/weights/e000002-33333333", "contents/edges/e000001-44444444",
                                   "result/labels"}


def test_garbage_is_what_no_commit_names(storage: Storage) -> None:
    named = locations(VERSIONS)
    for at in [*named, "inputs/edges/e000003-55555555", "result/labels/e000003-66666666"]:
        storage.write(f"iterate/cc/{at}/_delta_log/00000000000000000000.json", b"{}")
        storage.write(f"iterate/cc/{at}/part-0.parquet", b"x")
    storage.write("iterate/other/result/labels/e000001-77777777/part-0.parquet", b"another iterate")
    assert store(storage).collect_garbage(named) == 2
    left = {key.rsplit("/", 1)[0].removesuffix("/_delta_log") for key in storage.list("iterate/cc/")}
    assert left == {f"iterate/cc/{at}" for at in named}
    assert storage.list("iterate/other/") != []


def test_superseded_locations_go_whole_but_a_fixed_place_keeps_the_locations_inside(storage: Storage) -> None:
    for at in ["result/labels", "result/labels/e000004-88888888"]:
        storage.write(f"iterate/cc/{at}/part-0.parquet", b"x")
    store(storage).drop(["result/labels"])
    assert storage.list("iterate/cc/") == ["iterate/cc/result/labels/e000004-88888888/part-0.parquet"]
    store(storage).drop(["result/labels/e000004-88888888"])
    assert storage.list("iterate/cc/") == []


def test_a_driver_never_deletes_what_a_newer_epoch_wrote(storage: Storage) -> None:
    """A superseded driver reaching its start-up late resumed an older commit: the newer
    driver's tables are not garbage to it."""
    for at in ["result/labels/e000002-11111111", "result/labels/e000003-22222222"]:
        storage.write(f"iterate/cc/{at}/part-0.parquet", b"x")
    assert store(storage, epoch=2).collect_garbage(set()) == 1
    assert storage.list("iterate/cc/") == ["iterate/cc/result/labels/e000003-22222222/part-0.parquet"]
