"""How the iterate store reads a stored table's latest Delta version and a written version's
row count from the Delta log, on every backend."""

import json
from unittest.mock import Mock, patch

import pytest
from pyspark.sql.types import StructType

from spark_app.runtime.iterate.store import IterateStore
from spark_app.storage import Storage

LOG = "iterate/cc/inputs/edges/_delta_log/"


def test_the_latest_version_is_the_highest_commit_file_of_the_delta_log(storage: Storage) -> None:
    store = IterateStore(None, storage, "cc")  # type: ignore[arg-type] # listing needs no Spark
    for name in ["00000000000000000000.json", "00000000000000000001.json", "00000000000000000001.crc",
                 "00000000000000000002.json", "00000000000000000010.checkpoint.parquet", "_last_checkpoint",
                 ".00000000000000000011.json.3f2a.tmp", "_commits/00000000000000000012.3f2a.json"]:
        storage.write(LOG + name, b"{}")
    storage.write("iterate/cc/inputs/edges_2/_delta_log/00000000000000000007.json", b"{}")  # another table
    assert store._latest_version("inputs", "edges") == 2


def test_a_table_without_a_commit_is_an_error_that_names_it(storage: Storage) -> None:
    store = IterateStore(None, storage, "cc")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="inputs/edges/_delta_log"):
        store._latest_version("inputs", "edges")


def _commit(*actions: dict) -> bytes:
    return "\n".join(json.dumps(action) for action in actions).encode()


def test_the_rows_of_a_written_version_come_from_the_metrics_of_its_commit(storage: Storage) -> None:
    store = IterateStore(None, storage, "cc")  # type: ignore[arg-type] # reading the commit needs no Spark
    contents = "iterate/cc/contents/edges/_delta_log/"
    storage.write(contents + "00000000000000000003.json", _commit(
        {"commitInfo": {"operation": "WRITE", "operationMetrics": {"numFiles": "2", "numOutputRows": "999995"}}},
        {"add": {"path": "part-00000.parquet", "size": 10}},
    ))
    storage.write(contents + "00000000000000000004.json", _commit({"commitInfo": {"operationMetrics": {"numOutputRows": "7"}}}))
    assert store.written_rows("contents", "edges", 3, StructType()) == 999_995


def test_a_commit_without_metrics_is_counted_by_reading_the_version(storage: Storage) -> None:
    store = IterateStore(None, storage, "cc")  # type: ignore[arg-type]
    storage.write("iterate/cc/contents/edges/_delta_log/00000000000000000000.json",
                  _commit({"commitInfo": {"operation": "WRITE"}}, {"add": {"path": "part-00000.parquet"}}))
    read = Mock(return_value=Mock(count=Mock(return_value=12)))
    with patch.object(store, "read", read):
        assert store.written_rows("contents", "edges", 0, StructType()) == 12
    read.assert_called_once_with("contents", "edges", 0, StructType())
