"""How the iterate store finds a stored table's latest Delta version, on every backend."""

import pytest

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
