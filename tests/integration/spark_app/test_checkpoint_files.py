"""Spark's checkpoint files on S3 (offsets, commits, state store changelogs and snapshots),
written through the file manager a driver's session names for state on S3.

Every file Spark's checkpoint holds is written with ``createAtomic``: the file appears whole
or not at all, a write that fails fails its writer, and a create-if-absent loses to a file
written meanwhile (Spark's metadata logs turn that into a ConcurrentModificationException).
spark-hadoop-cloud's manager, which the session named until 2026-12-06, logged a failed
upload at close, or a file written meanwhile, as a warning and returned as if it had
written the file. Its checkpoint managers also each built an S3A file system of their own
(an AWS SDK client, a connection pool and thread pools): eight in a resumed driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from bench.resume.round_trips import RoundTrips
from spark_app.persistence import Backend
from spark_app.runtime.jvm.conf import spark_conf
from spark_app.runtime.jvm.session import build_session
from tests.support.outage import Outage
from tests.support.s3 import S3Server

pytestmark = [pytest.mark.spark, pytest.mark.s3]

CHECKPOINTING = "org.apache.spark.sql.execution.streaming.checkpointing"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield build_session(spark_conf(Backend.filesystem("/tmp"), 10_000,
                                   {"spark.master": "local[1]", "spark.ui.enabled": "false"}))


@pytest.fixture
def outage(s3_server: S3Server, tmp_path: Path) -> Iterator[Outage]:
    """The S3 server behind a proxy that a test can stop (connections refused)."""
    proxy = Outage(s3_server.endpoint_url, tmp_path / "proxy.log")
    proxy.start()
    yield proxy
    proxy.stop()


class Logged:
    """The S3 server behind a proxy that logs each request's line, with no delay."""

    def __init__(self, s3_server: S3Server, log: Path) -> None:
        self._log = log
        self._proxy = RoundTrips(int(s3_server.endpoint_url.rsplit(":", 1)[1]), 0.0, log)
        self.endpoint = self._proxy.endpoint

    def count(self) -> int:
        return len(self._log.read_text().splitlines())

    def since(self, count: int) -> list[str]:
        """The request lines after the first ``count``."""
        return [line.split(" ", 2)[2] for line in self._log.read_text().splitlines()[count:]]

    def stop(self) -> None:
        self._proxy.stop()


@pytest.fixture
def logged(s3_server: S3Server, tmp_path: Path) -> Iterator[Logged]:
    proxy = Logged(s3_server, tmp_path / "requests.log")
    yield proxy
    proxy.stop()


class Checkpoint:
    """A query checkpoint's folder in a bucket of its own, its manager made as Spark makes
    one, with the Hadoop settings of a driver whose state is on S3 behind ``endpoint``."""

    def __init__(self, spark: SparkSession, s3_server: S3Server, endpoint: str) -> None:
        self.s3 = s3_server.client()
        self.bucket = s3_server.new_bucket()
        self.jvm: Any = spark.sparkContext._jvm
        self.conf = self.jvm.org.apache.hadoop.conf.Configuration(spark.sparkContext._jsc.hadoopConfiguration())
        for key, value in spark_conf(Backend.s3(f"s3a://{self.bucket}/state", endpoint_url=endpoint), 10_000,
                                     {}).items():
            if key.startswith("spark.hadoop."):
                self.conf.set(key.removeprefix("spark.hadoop."), value)
        # S3A gives up at the first refused connection: the outage needs no 15 s of retries.
        self.conf.set("fs.s3a.retry.limit", "0")
        self.conf.set("fs.s3a.attempts.maximum", "1")
        self.manager = self.manager_of("state/checkpoints/q/offsets")
        self.manager.mkdirs(self.path("state/checkpoints/q/offsets"))  # as Spark's metadata log does first

    def path(self, key: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path(f"s3a://{self.bucket}/{key}")

    def manager_of(self, key: str) -> Any:
        module = getattr(getattr(self.jvm, f"{CHECKPOINTING}.CheckpointFileManager$"), "MODULE$")
        return module.create(self.path(key), self.conf)

    def written(self, key: str, data: bytes, overwrite: bool = False) -> Any:
        """A stream of ``key`` with ``data`` written to it, not yet closed."""
        stream = self.manager.createAtomic(self.path(key), overwrite)
        stream.write(bytearray(data))
        return stream

    def read_whole(self, stream: Any) -> bytes:
        """What a stream the manager opened holds, to its end."""
        return bytes(self.jvm.org.apache.commons.io.IOUtils.toByteArray(stream))

    def read(self, key: str) -> bytes | None:
        try:
            return bytes(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except self.s3.exceptions.NoSuchKey:
            return None


def test_a_checkpoint_file_whose_upload_fails_fails_its_writer(spark: SparkSession, s3_server: S3Server,
                                                              outage: Outage) -> None:
    """S3A uploads a small file as its stream closes: an outage then is the writer's error.
    Swallowed, Spark went on as if the offsets, commit or state store changelog were stored."""
    checkpoint = Checkpoint(spark, s3_server, outage.url)
    stream = checkpoint.written("state/checkpoints/q/offsets/7", b"v1\n{}")
    outage.stop()
    with pytest.raises(Py4JJavaError) as failed:
        stream.close()
    assert checkpoint.jvm.java.lang.Class.forName("java.io.IOException").isInstance(failed.value.java_exception)
    outage.start()
    assert checkpoint.read("state/checkpoints/q/offsets/7") is None


def test_a_create_if_absent_loses_to_a_file_written_meanwhile(spark: SparkSession, s3_server: S3Server) -> None:
    """Two writers of one offsets file (a stale driver and its successor): the later close
    fails with FileAlreadyExistsException, which Spark's metadata log reports as a concurrent
    update, and the file keeps the first writer's bytes."""
    checkpoint = Checkpoint(spark, s3_server, s3_server.endpoint_url)
    stream = checkpoint.written("state/checkpoints/q/offsets/7", b"mine")
    checkpoint.s3.put_object(Bucket=checkpoint.bucket, Key="state/checkpoints/q/offsets/7", Body=b"theirs")
    with pytest.raises(Py4JJavaError) as lost:
        stream.close()
    assert "org.apache.hadoop.fs.FileAlreadyExistsException" in str(lost.value.java_exception.getClass()), lost.value
    assert checkpoint.read("state/checkpoints/q/offsets/7") == b"theirs"


def test_a_create_if_absent_that_finds_its_own_upload_succeeds(spark: SparkSession, s3_server: S3Server) -> None:
    """The AWS SDK retries a PUT whose response was lost; when the first attempt had landed,
    the retry's If-None-Match fails against the writer's own file, which is a success."""
    checkpoint = Checkpoint(spark, s3_server, s3_server.endpoint_url)
    stream = checkpoint.written("state/checkpoints/q/offsets/7", b"v1\nmine")
    checkpoint.s3.put_object(Bucket=checkpoint.bucket, Key="state/checkpoints/q/offsets/7", Body=b"v1\nmine")
    stream.close()
    assert checkpoint.read("state/checkpoints/q/offsets/7") == b"v1\nmine"


def test_a_checkpoint_file_appears_whole_when_closed_and_never_when_cancelled(spark: SparkSession,
                                                                             s3_server: S3Server) -> None:
    checkpoint = Checkpoint(spark, s3_server, s3_server.endpoint_url)
    cancelled = checkpoint.written("state/checkpoints/q/offsets/7", b"half")
    cancelled.cancel()
    assert checkpoint.read("state/checkpoints/q/offsets/7") is None
    first = checkpoint.written("state/checkpoints/q/offsets/7", b"v1\nfirst")
    assert checkpoint.read("state/checkpoints/q/offsets/7") is None  # nothing shows before the close
    first.close()
    assert checkpoint.read("state/checkpoints/q/offsets/7") == b"v1\nfirst"
    checkpoint.written("state/checkpoints/q/offsets/7", b"v1\nsecond", overwrite=True).close()
    assert checkpoint.read("state/checkpoints/q/offsets/7") == b"v1\nsecond"


def test_a_state_store_file_is_written_over_in_one_request(spark: SparkSession, s3_server: S3Server,
                                                          logged: Logged) -> None:
    """A state store's changelog, snapshot and checksum files are written over whatever is
    there, every batch; S3A listed each path first (a file must not go over a directory),
    a round trip of every write that Spark's file names never need. Seen through a proxy
    that logs every request."""
    checkpoint = Checkpoint(spark, s3_server, logged.endpoint)
    before = logged.count()
    checkpoint.written("state/checkpoints/q/state/0/0/2.changelog", b"changes", overwrite=True).close()
    assert logged.since(before) == [f"PUT /{checkpoint.bucket}/state/checkpoints/q/state/0/0/2.changelog HTTP/1.1"]
    assert checkpoint.read("state/checkpoints/q/state/0/0/2.changelog") == b"changes"


def test_a_file_found_is_opened_with_the_status_its_existence_check_got(spark: SparkSession, s3_server: S3Server,
                                                                        logged: Logged) -> None:
    """Spark asks whether a metadata log's or a state store's file exists, then opens it;
    S3A asked for the file's status again to open it, a round trip of every such file as a
    query resumes."""
    checkpoint = Checkpoint(spark, s3_server, logged.endpoint)
    checkpoint.s3.put_object(Bucket=checkpoint.bucket, Key="state/checkpoints/q/offsets/7", Body=b"v1\n{}")
    before = logged.count()
    path = checkpoint.path("state/checkpoints/q/offsets/7")
    assert checkpoint.manager.exists(path)
    assert checkpoint.read_whole(checkpoint.manager.open(path)) == b"v1\n{}"
    key = f"/{checkpoint.bucket}/state/checkpoints/q/offsets/7"
    assert logged.since(before) == [f"HEAD {key} HTTP/1.1", f"GET {key} HTTP/1.1"]


def test_a_state_store_file_found_is_opened_with_that_status_from_the_checksum_managers_threads(
        spark: SparkSession, s3_server: S3Server, logged: Logged) -> None:
    """A state store's files go through Spark's checksum manager, which opens a file and its
    checksum on threads of its own, not the thread that asked whether the file exists."""
    checkpoint = Checkpoint(spark, s3_server, logged.endpoint)
    checksums = getattr(checkpoint.jvm, f"{CHECKPOINTING}.ChecksumCheckpointFileManager")(
        checkpoint.manager, True, 4, True)
    path = checkpoint.path("state/checkpoints/q/state/0/0/6.zip")
    stream = checksums.createAtomic(path, True)
    stream.write(bytearray(b"a snapshot"))
    stream.close()
    before = logged.count()
    assert checksums.exists(path)
    opened = checksums.open(path)
    assert checkpoint.read_whole(opened) == b"a snapshot"
    opened.close()  # verifies the checksum
    key = f"/{checkpoint.bucket}/state/checkpoints/q/state/0/0/6.zip"
    assert sorted(logged.since(before)) == sorted([f"HEAD {key} HTTP/1.1", f"GET {key} HTTP/1.1",
                           f"HEAD {key}.crc HTTP/1.1", f"GET {key}.crc HTTP/1.1"])


def test_a_file_written_over_between_its_existence_check_and_its_open_is_never_read_stale(
        spark: SparkSession, s3_server: S3Server) -> None:
    """The status that the check got describes an object no longer there: the read fails,
    as it does between S3A's own status request and its read, rather than return the old
    bytes or the new ones cut to the old length."""
    checkpoint = Checkpoint(spark, s3_server, s3_server.endpoint_url)
    key = "state/checkpoints/q/state/0/0/_metadata/schema"
    checkpoint.s3.put_object(Bucket=checkpoint.bucket, Key=key, Body=b"first")
    path = checkpoint.path(key)
    assert checkpoint.manager.exists(path)
    checkpoint.s3.put_object(Bucket=checkpoint.bucket, Key=key, Body=b"second, and longer")
    with pytest.raises(Py4JJavaError) as changed:
        checkpoint.read_whole(checkpoint.manager.open(path))
    assert "RemoteFileChangedException" in str(changed.value.java_exception), changed.value


def test_a_file_this_manager_writes_over_after_its_existence_check_is_read_anew(spark: SparkSession,
                                                                               s3_server: S3Server) -> None:
    """Spark's checksum manager asks whether a state store file exists before it writes the
    file over (a batch run again): what that check saw is gone once the write closes."""
    checkpoint = Checkpoint(spark, s3_server, s3_server.endpoint_url)
    key = "state/checkpoints/q/state/0/0/2.changelog"
    checkpoint.s3.put_object(Bucket=checkpoint.bucket, Key=key, Body=b"the first attempt's")
    path = checkpoint.path(key)
    assert checkpoint.manager.exists(path)
    checkpoint.written(key, b"the second attempt's, longer", overwrite=True).close()
    assert checkpoint.read_whole(checkpoint.manager.open(path)) == b"the second attempt's, longer"


def test_a_querys_checkpoint_managers_share_the_drivers_one_s3_file_system(spark: SparkSession,
                                                                          s3_server: S3Server) -> None:
    """Hadoop's cached file system, not one per manager: a resumed driver had eight S3A file
    systems, each with its AWS SDK client, connections and threads (bench/README.md)."""
    checkpoint = Checkpoint(spark, s3_server, s3_server.endpoint_url)
    cached = checkpoint.path("state").getFileSystem(checkpoint.conf)
    for key in ("state/checkpoints/q/offsets", "state/checkpoints/q/commits", "state/checkpoints/q/state/0/1"):
        manager = checkpoint.manager_of(key)
        field = manager.getClass().getSuperclass().getDeclaredField("fs")
        field.setAccessible(True)
        assert field.get(manager).equals(cached), (key, manager.getClass().getName())
