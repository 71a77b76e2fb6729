"""The storage contract, run against the filesystem and the S3 backend alike."""

from __future__ import annotations

import threading

import pytest

from spark_app.persistence import Backend
from spark_app.storage import NotFound, Storage, StorageMisconfigured


def test_write_then_read_round_trips(storage: Storage) -> None:
    storage.write("a/b.json", b"one")
    assert storage.read("a/b.json") == b"one"
    storage.write("a/b.json", b"two")
    assert storage.read("a/b.json") == b"two"


def test_read_of_missing_key_raises_not_found(storage: Storage) -> None:
    with pytest.raises(NotFound):
        storage.read("missing")


def test_create_is_put_if_absent(storage: Storage) -> None:
    assert storage.create("log/1", b"first") is True
    assert storage.create("log/1", b"second") is False
    assert storage.read("log/1") == b"first"


def test_one_of_many_racing_creates_wins_with_its_complete_bytes(storage: Storage) -> None:
    results: dict[int, bool] = {}

    def attempt(i: int) -> None:
        results[i] = storage.create("race", f"writer-{i}".encode() * 1000)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [i for i, won in results.items() if won]
    assert len(winners) == 1
    assert storage.read("race") == f"writer-{winners[0]}".encode() * 1000


def test_list_returns_sorted_keys_under_a_prefix(storage: Storage) -> None:
    for key in ["log/2", "log/1", "logs/x", "other/1", "log/sub/3"]:
        storage.write(key, b"")
    assert storage.list("log/") == ["log/1", "log/2", "log/sub/3"]
    assert storage.list("log") == ["log/1", "log/2", "log/sub/3", "logs/x"]


def test_delete_and_delete_prefix(storage: Storage) -> None:
    for key in ["x/1", "x/2", "y/1"]:
        storage.write(key, b"12345")
    assert storage.size("x/") == 10
    storage.delete("x/1")
    storage.delete("x/1")  # deleting a missing key is fine
    assert storage.list("x/") == ["x/2"]
    assert storage.delete_prefix("x/") == 1
    assert storage.list("") == ["y/1"]


def test_spark_uri_points_at_the_same_place(backend: Backend, storage: Storage) -> None:
    uri = storage.spark_uri("checkpoints/q")
    if backend.kind == "s3":
        assert uri == backend.root.replace("s3://", "s3a://") + "/checkpoints/q"
    else:
        assert uri == f"file://{backend.root}/checkpoints/q"


def test_check_writable_accepts_a_usable_root(storage: Storage) -> None:
    storage.check_writable()


def test_missing_bucket_is_reported_in_one_sentence(s3_server) -> None:  # type: ignore[no-untyped-def]
    storage = Backend.s3("s3://no-such-bucket-here/p", endpoint_url=s3_server.endpoint_url).storage()
    with pytest.raises(StorageMisconfigured, match="the bucket no-such-bucket-here does not exist"):
        storage.check_writable()


def test_unwritable_folder_is_reported(tmp_path) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    storage = Backend.filesystem(blocker / "state").storage()
    with pytest.raises(StorageMisconfigured, match="not writable"):
        storage.check_writable()


def test_delete_prefix_removes_directory_markers_too(backend: Backend, storage: Storage) -> None:
    if backend.kind == "s3":
        from spark_app.storage import S3Location

        location = S3Location.parse(backend.root, endpoint_url=backend.endpoint_url)
        client = storage.inner._client  # type: ignore[attr-defined]
        client.put_object(Bucket=location.bucket, Key=f"{location.prefix}/checkpoints/q/", Body=b"")
    storage.write("checkpoints/q/offsets/0", b"x")
    storage.delete_prefix("")
    assert storage.list("") == []
    if backend.kind == "s3":
        assert "Contents" not in client.list_objects_v2(Bucket=location.bucket, Prefix=location.prefix)
