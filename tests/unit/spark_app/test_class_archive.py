"""Which class archive a driver maps (only one recorded for its exact JVM and jars), and the
native library unpacked beside it."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from spark_app.runtime.jvm import class_archive, native_library


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "jars"
    folder.mkdir()
    (folder / "delta-spark.jar").write_bytes(b"x" * 10)
    monkeypatch.setenv(class_archive.ARCHIVES_ENV, str(tmp_path / "archives"))
    return folder


def test_no_archive_recorded_means_no_options(jars: Path) -> None:
    assert class_archive.java_options(class_archive.archive_path(str(jars))) == ""


def test_a_recorded_archive_is_mapped_if_possible(jars: Path) -> None:
    path = class_archive.archive_path(str(jars))
    assert path is not None and path.parent == class_archive.archives_folder()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    assert class_archive.java_options(path) == f"-XX:SharedArchiveFile={path} -Xshare:auto"


def test_another_jar_set_or_jvm_is_another_archive(jars: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = class_archive.archive_path(str(jars))
    assert class_archive.archive_path(str(jars)) == before
    (jars / "delta-spark.jar").write_bytes(b"x" * 11)
    resized = class_archive.archive_path(str(jars))
    (jars / "hadoop-aws.jar").write_bytes(b"y")
    added = class_archive.archive_path(str(jars))
    other_java = tmp_path / "jdk" / "bin" / "java"
    other_java.parent.mkdir(parents=True)
    other_java.write_bytes(b"#!")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    elsewhere = class_archive.archive_path(str(jars))
    assert len({before, resized, added, elsewhere}) == 4


def test_no_java_no_archive(jars: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", "/nonexistent")
    assert class_archive.archive_path(str(jars)) is None
    assert class_archive.java_options(class_archive.archive_path(str(jars))) == ""


# RocksDB's native library, unpacked beside the archive (spark_app.runtime.jvm.native_library).

def test_rocksdb_is_looked_up_under_its_jars_name_for_the_platform() -> None:
    assert native_library.rocksdb_library_name("Linux", "x86_64", musl=False) == "librocksdbjni-linux64.so"
    assert native_library.rocksdb_library_name("Linux", "aarch64", musl=True) == "librocksdbjni-linux-aarch64-musl.so"
    # The JDK maps a library's name to another file name on macOS and Windows than the jar's.
    assert native_library.rocksdb_library_name("Darwin", "arm64", musl=False) is None
    assert native_library.rocksdb_library_name("Linux", "sparc", musl=False) is None


@pytest.fixture
def linux64(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(native_library, "_this_platforms_name", lambda: "librocksdbjni-linux64.so")
    return "librocksdbjni-linux64.so"


def _rocksdb_jar(folder: Path, members: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "rocksdbjni-9.8.4.jar", "w") as jar:
        for name, data in members.items():
            jar.writestr(name, data)
    return folder


def test_the_library_is_unpacked_once_and_then_named_as_the_jvms_library_path(
        jars: Path, tmp_path: Path, linux64: str) -> None:
    spark_jars = _rocksdb_jar(tmp_path / "spark-jars", {linux64: b"\x7fELF linux64", "librocksdbjni-win64.dll": b"w"})
    archive = class_archive.archive_path(str(jars))
    assert archive is not None
    assert class_archive.library_path(archive) is None  # nothing unpacked yet: RocksDB copies its own out
    folder = archive.with_suffix(".native")
    unpacked = native_library.unpack(folder, [str(jars), str(spark_jars)])
    assert unpacked == folder / linux64 and unpacked.read_bytes() == b"\x7fELF linux64"
    assert sorted(p.name for p in folder.iterdir()) == [linux64]  # no other platform's, no partial copy
    assert class_archive.library_path(archive) == str(folder)
    unpacked.write_bytes(b"kept")
    assert native_library.unpack(folder, [str(spark_jars)]) == unpacked and unpacked.read_bytes() == b"kept"


def test_nothing_is_unpacked_without_rocksdbs_jar_or_this_platforms_library(tmp_path: Path, linux64: str) -> None:
    assert native_library.unpack(tmp_path / "native", [str(tmp_path)]) is None
    other = _rocksdb_jar(tmp_path / "jars", {"librocksdbjni-osx-arm64.jnilib": b"m"})
    assert native_library.unpack(tmp_path / "native", [str(other)]) is None
    assert not (tmp_path / "native").exists()


def test_the_library_comes_from_the_binding_first_on_the_class_path(tmp_path: Path, linux64: str) -> None:
    ours = _rocksdb_jar(tmp_path / "user-jars", {linux64: b"ours"})  # sorts after Spark's folder
    sparks = _rocksdb_jar(tmp_path / "spark-jars", {linux64: b"spark's"})
    unpacked = native_library.unpack(tmp_path / "native", [str(ours), str(sparks)])
    assert unpacked is not None and unpacked.read_bytes() == b"ours"
