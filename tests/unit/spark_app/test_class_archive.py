"""Which class archive a driver maps: only one recorded for its exact JVM and jars."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_app.runtime.jvm import class_archive


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "jars"
    folder.mkdir()
    (folder / "delta-spark.jar").write_bytes(b"x" * 10)
    monkeypatch.setenv(class_archive.ARCHIVES_ENV, str(tmp_path / "archives"))
    return folder


def test_no_archive_recorded_means_no_options(jars: Path) -> None:
    assert class_archive.java_options(str(jars)) == ""


def test_a_recorded_archive_is_mapped_if_possible(jars: Path) -> None:
    path = class_archive.archive_path(str(jars))
    assert path is not None and path.parent == class_archive.archives_folder()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    assert class_archive.java_options(str(jars)) == f"-XX:SharedArchiveFile={path} -Xshare:auto"


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
    assert class_archive.java_options(str(jars)) == ""
