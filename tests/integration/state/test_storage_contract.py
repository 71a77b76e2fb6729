"""The storage contract, run against the filesystem and the S3 backend alike."""

from __future__ import annotations

import errno
import threading
import time

import pytest

from spark_app.persistence import Backend
from spark_app.storage import (
    FilesystemStorage,
    NotFound,
    RetryingStorage,
    RetryPolicy,
    S3Location,
    S3Storage,
    Storage,
    StorageMisconfigured,
    StorageUnavailable,
)


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


def test_a_local_file_goes_in_and_comes_out_whole_and_replaces_the_key(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Over one part of the S3 transfer (32 MiB), so that it goes up and comes down in parts.
    large = tmp_path / "large"
    large.write_bytes(bytes(range(256)) * (40 * 2**20 // 256) + b"end")
    storage.write("snapshots/s", b"the old value")
    storage.write_file("snapshots/s", str(large))
    assert storage.size("snapshots/") == large.stat().st_size
    copy = tmp_path / "copy"
    storage.read_file("snapshots/s", str(copy))
    assert copy.read_bytes() == large.read_bytes()
    assert storage.list("snapshots/") == ["snapshots/s"]  # no part or temporary file left beside it
    with pytest.raises(NotFound):
        storage.read_file("snapshots/missing", str(tmp_path / "never"))


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


def test_delete_prefix_removes_directory_markers_too(backend: Backend, storage: Storage,
                                                   request: pytest.FixtureRequest) -> None:
    if backend.kind == "s3":
        from spark_app.storage import S3Location

        location = S3Location.parse(backend.root, endpoint_url=backend.endpoint_url)
        client = request.getfixturevalue("s3_server").client()  # Hadoop writes these markers, not we
        client.put_object(Bucket=location.bucket, Key=f"{location.prefix}/checkpoints/q/", Body=b"")
    storage.write("checkpoints/q/offsets/0", b"x")
    storage.delete_prefix("")
    assert storage.list("") == []
    if backend.kind == "s3":
        assert "Contents" not in client.list_objects_v2(Bucket=location.bucket, Prefix=location.prefix)


def test_list_entries_gives_sizes_and_modification_times(storage: Storage) -> None:
    before = int(time.time() * 1000) - 2000
    storage.write("in/a.csv", b"12345")
    storage.write("in/sub/b.csv", b"1")
    storage.write("other/c.csv", b"")
    entries = storage.list_entries("in/")
    assert [(e.path, e.size) for e in entries] == [("a.csv", 5), ("sub/b.csv", 1)]
    assert all(e.mtime_ms >= before for e in entries)


def test_check_writable_rides_out_a_transient_failure() -> None:
    flaky = Flaky(failures=2)
    RetryingStorage(flaky, RetryPolicy(initial_delay_s=0.0), sleep=lambda _: None).check_writable()
    assert flaky.calls == 3


def test_an_io_error_of_the_state_folder_is_transient(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """EIO or ESTALE of a network volume is an outage to wait out, not a wrong setting."""
    storage = FilesystemStorage(tmp_path / "state")

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("spark_app.storage.filesystem.tempfile.mkstemp", broken)
    with pytest.raises(StorageUnavailable):
        storage.check_writable()
    with pytest.raises(StorageUnavailable):
        storage.write("x", b"1")


def test_a_read_cut_off_mid_body_is_retried(s3_server) -> None:  # type: ignore[no-untyped-def]
    from botocore.exceptions import ResponseStreamingError

    bucket = s3_server.new_bucket()
    real = s3_server.client()
    real.put_object(Bucket=bucket, Key="p/k", Body=b"payload")

    class CutOff:
        def read(self) -> bytes:
            raise ResponseStreamingError(error="connection reset by peer")

    class OnceCutOff:
        def __init__(self) -> None:
            self.cut = False

        def __getattr__(self, name):  # type: ignore[no-untyped-def]
            return getattr(real, name)

        def get_object(self, **kwargs):  # type: ignore[no-untyped-def]
            response = real.get_object(**kwargs)
            if not self.cut:
                self.cut = True
                response["Body"] = CutOff()
            return response

    inner = S3Storage(S3Location(bucket, "p", s3_server.endpoint_url, path_style=True), client=OnceCutOff())
    storage = RetryingStorage(inner, RetryPolicy(initial_delay_s=0.0), sleep=lambda _: None)
    assert storage.read("k") == b"payload"


class Flaky:
    """A storage whose check_writable fails transiently a few times first."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def check_writable(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise StorageUnavailable("503 Service Unavailable")


def test_read_range_reads_part_of_a_key(storage: Storage) -> None:
    storage.write("big", b"0123456789")
    assert storage.read_range("big", 2, 5) == b"234"
    assert storage.read_range("big", 8, 20) == b"89"
    assert storage.read_range("big", 10, 20) == b""
    with pytest.raises(NotFound):
        storage.read_range("missing", 0, 1)
