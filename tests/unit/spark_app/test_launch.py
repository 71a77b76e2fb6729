"""How a driver's JVM is started, as spark_app.runtime.jvm.launch does it (no Spark started:
a ``cat``, which ends when its stdin closes as the JVM's gateway does, stands in for the JVM
where a process is needed)."""

from __future__ import annotations

import json
import re
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_app.runtime.jvm import launch, start_up_methods
from spark_app.runtime.jvm.jars import spark_home


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "jars"
    folder.mkdir()
    (folder / "extra.jar").write_bytes(b"")
    monkeypatch.setenv("SPARK_APP_JARS_DIR", str(folder))
    monkeypatch.setenv("SPARK_APP_CLASS_ARCHIVES", str(tmp_path / "archives"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    return folder


@pytest.fixture
def no_early_jvm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(launch, "_early", None)
    yield
    launch.discard()


def test_spark_is_found_where_pyspark_finds_it_without_importing_pyspark(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.find_spark_home import _find_spark_home

    monkeypatch.delenv("SPARK_HOME", raising=False)
    assert spark_home() == _find_spark_home()
    assert spark_home({"SPARK_HOME": "/opt/spark"}) == "/opt/spark"


def test_spark_submit_gets_every_setting_as_pyspark_would_pass_it() -> None:
    command = launch.submit_command("/spark", {"spark.master": "local[2]", "spark.app.name": "a b"}, {})
    assert command == ["/spark/bin/spark-submit", "--conf", "spark.master=local[2]", "--conf", "spark.app.name=a b",
                       "pyspark-shell"]


def test_spark_submit_takes_pysparks_own_submit_arguments() -> None:
    environ = {"PYSPARK_SUBMIT_ARGS": "--driver-memory 2g pyspark-shell", "SPARK_TESTING": "1"}
    assert launch.submit_command("/spark", {}, environ)[1:] == [
        "--conf", "spark.ui.enabled=false", "--driver-memory", "2g", "pyspark-shell"]


def test_the_gateways_connection_info_is_read_as_the_jvm_writes_it() -> None:
    secret = "s3cr\u00e9t".encode()
    assert launch.read_connection_info(struct.pack(">ii", 40123, len(secret)) + secret) == (40123, "s3cr\u00e9t")
    with pytest.raises(ValueError, match="cut short"):
        launch.read_connection_info(struct.pack(">ii", 40123, 10) + b"abc")


def test_a_new_jvm_gets_its_own_folders_and_java_options_ahead_of_the_users(jars: Path) -> None:
    prepared = launch.prepare({"spark.driver.defaultJavaOptions": "-Dmine=1", "spark.master": "local[1]"}, new_jvm=True)
    options = prepared.settings["spark.driver.defaultJavaOptions"].split()
    assert options[-1] == "-Dmine=1" and options[-2].startswith("-Djava.io.tmpdir=")
    assert Path(options[-2].removeprefix("-Djava.io.tmpdir=")).is_dir()
    assert prepared.settings["spark.driver.extraClassPath"] == f"{jars}/*"
    assert Path(prepared.environment["SPARK_LOCAL_DIRS"]).is_dir()


def test_a_new_jvm_keeps_its_start_up_only_methods_from_c2(jars: Path) -> None:
    options = launch.prepare({}, new_jvm=True).settings["spark.driver.defaultJavaOptions"].split()
    directives = f"-XX:CompilerDirectivesFile={start_up_methods.DIRECTIVES}"
    # HotSpot reads a directives file only with diagnostic options unlocked before it.
    assert directives in options and "-XX:+UnlockDiagnosticVMOptions" in options[:options.index(directives)]


def test_a_missing_directives_file_gives_no_option_the_jvm_would_refuse_to_start_with(tmp_path: Path) -> None:
    assert start_up_methods.java_options(tmp_path / "start_up_methods.json") == ""


def test_the_directives_name_methods_as_hotspot_matches_them_and_exclude_c2_alone() -> None:
    directives = json.loads(start_up_methods.DIRECTIVES.read_text())
    assert [set(d) for d in directives] == [{"match", "c2"}] and directives[0]["c2"] == {"Exclude": True}
    # HotSpot's pattern: a class path with slashes, a dot, a method; a star only at either
    # end of each (a pattern it cannot parse stops the JVM from starting).
    pattern = re.compile(r"^\*?[\w/$]+\*?\.(\*|<?\w+>?)$")
    assert [m for m in directives[0]["match"] if not pattern.match(m)] == []


def test_a_session_on_a_running_jvm_gets_no_jvm_options_or_folders(jars: Path) -> None:
    prepared = launch.prepare({"spark.master": "local[1]"}, new_jvm=False)
    assert "spark.driver.defaultJavaOptions" not in prepared.settings
    assert prepared.environment == {}


def test_a_configured_local_folder_is_left_to_spark(jars: Path) -> None:
    assert "SPARK_LOCAL_DIRS" not in launch.prepare({"spark.local.dir": "/data"}, new_jvm=True).environment


def _stand_in(conf: dict[str, str], tmp_path: Path) -> launch.EarlyJvm:
    process = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    return launch.EarlyJvm(conf, launch.JvmLaunch(conf, {}), process, str(tmp_path / "connection.info"))


def test_the_session_takes_the_jvm_started_for_its_configuration(tmp_path: Path, no_early_jvm: None) -> None:
    early = launch._early = _stand_in({"spark.master": "local[2]"}, tmp_path)
    assert launch.take({"spark.master": "local[2]"}) is early
    assert early.process.poll() is None
    assert launch.take({"spark.master": "local[2]"}) is None, "taken once"
    early.stop()


def test_a_jvm_started_for_another_configuration_is_stopped(tmp_path: Path, no_early_jvm: None) -> None:
    early = launch._early = _stand_in({"spark.master": "local[2]"}, tmp_path)
    assert launch.take({"spark.master": "local[2]", "spark.driver.memory": "4g"}) is None
    assert early.process.poll() is not None


def test_a_jvm_no_session_takes_is_stopped(tmp_path: Path, no_early_jvm: None) -> None:
    early = launch._early = _stand_in({}, tmp_path)
    launch.discard()
    assert early.process.poll() is not None and launch._early is None


def test_a_jvm_that_ended_gives_no_connection(tmp_path: Path) -> None:
    process = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    early = launch.EarlyJvm({}, launch.JvmLaunch({}, {}), process, str(tmp_path / "connection.info"))
    assert early.connection() is None


def test_nothing_starts_early_in_a_process_that_imported_pyspark(no_early_jvm: None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark  # noqa: F401 - the condition under test

    started: list[object] = []
    monkeypatch.setattr(launch.EarlyJvm, "start", lambda *args: started.append(args))
    assert launch.start_early() is None
    assert started == []


def test_rocksdbs_unpacked_library_goes_ahead_of_the_users_library_path(jars: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_app.runtime.jvm import class_archive

    monkeypatch.setattr(class_archive, "library_path", lambda _: str(tmp_path / "native"))
    prepared = launch.prepare({"spark.driver.extraLibraryPath": "/opt/mine"}, new_jvm=True)
    assert prepared.settings["spark.driver.extraLibraryPath"] == f"{tmp_path}/native:/opt/mine"
    assert "spark.driver.extraLibraryPath" not in launch.prepare({}, new_jvm=False).settings
    monkeypatch.setattr(class_archive, "library_path", lambda _: None)
    assert "spark.driver.extraLibraryPath" not in launch.prepare({}, new_jvm=True).settings


def test_a_users_class_path_comes_after_spark_apps_jars(jars: Path) -> None:
    prepared = launch.prepare({"spark.driver.extraClassPath": "/opt/jdbc.jar",
                               "spark.executor.extraClassPath": "/opt/udfs/*"}, new_jvm=True)
    assert prepared.settings["spark.driver.extraClassPath"] == f"{jars}/*:/opt/jdbc.jar"
    assert prepared.settings["spark.executor.extraClassPath"] == f"{jars}/*:/opt/udfs/*"
