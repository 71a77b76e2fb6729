"""The session's configuration, as spark_conf builds it (no Spark started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_app.persistence import Backend
from spark_app.runtime.jvm.conf import DELTA_S3_LOG_STORE, spark_conf

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("backend", [Backend.filesystem("/tmp/state"),
                                     Backend.s3("s3://bucket/state", endpoint_url="http://127.0.0.1:9000")],
                         ids=["filesystem", "s3"])
def test_every_session_commits_delta_versions_on_s3_with_put_if_absent(backend: Backend) -> None:
    """Whatever the state backend: a pipeline may write a Delta table to S3 either way."""
    conf = spark_conf(backend, 10_000, {})
    assert conf["spark.delta.logStore.s3a.impl"] == DELTA_S3_LOG_STORE
    assert conf["spark.hadoop.fs.s3a.create.conditional.enabled"] == "true"


def test_the_log_store_is_one_that_make_jars_compiles() -> None:
    source = REPO / "tools" / "jars" / "java" / (DELTA_S3_LOG_STORE.replace(".", "/") + ".java")
    assert source.is_file()


def test_the_fair_scheduler_names_the_backfill_pool_in_a_file_the_package_carries() -> None:
    """Without the pool in the allocation file, Spark created it with a warning in every
    backfilling driver's log; with a file that is not there, the session would not start."""
    import xml.etree.ElementTree as ET

    from spark_app.runtime.sources.delta_table import READ_ASIDE_POOL

    conf = spark_conf(Backend.filesystem("/tmp/state"), 10_000, {})
    pools = Path(conf["spark.scheduler.allocation.file"])
    assert pools.is_file() and pools.parent == REPO / "spark_app" / "runtime" / "jvm"
    names = {pool.get("name") for pool in ET.parse(pools).getroot().iter("pool")}
    assert names == {"default", READ_ASIDE_POOL}


def test_an_s3_compatible_server_gets_local_files_through_s3as_output_stream_and_aws_keeps_its_transfer() -> None:
    on_server = spark_conf(Backend.s3("s3://bucket/state", endpoint_url="http://127.0.0.1:9000"), 1000, {})
    on_aws = spark_conf(Backend.s3("s3://bucket/state", region="eu-west-1"), 1000, {})
    assert on_server["spark.hadoop.fs.s3a.optimized.copy.from.local.enabled"] == "false"
    assert "spark.hadoop.fs.s3a.optimized.copy.from.local.enabled" not in on_aws


class _FakeSession:
    """What apply_runtime_conf asks of a started session: its SparkConf as started, its SQL
    settings (``static`` ones cannot change any more) and Hadoop's configuration."""

    def __init__(self, started: dict[str, str], sql: dict[str, str], static: set[str]) -> None:
        from types import SimpleNamespace

        self.hadoop: dict[str, str] = {}
        self.sql, self.static = sql, static
        conf = SimpleNamespace(getAll=lambda: list(started.items()))
        self.sparkContext = SimpleNamespace(getConf=lambda: conf,
                                            _jsc=SimpleNamespace(hadoopConfiguration=lambda: SimpleNamespace(
                                                set=self.hadoop.__setitem__)))
        self.conf = SimpleNamespace(get=lambda key, default=None: self.sql.get(key, default),
                                    isModifiable=lambda key: key not in self.static, set=self.sql.__setitem__)


def test_a_requested_static_sql_setting_that_came_too_late_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """A static SQL setting (one Spark reads once, when the session starts) that the
    pipeline asked for after the session had started was dropped without a word when the
    session had not been built with it; it is named in a warning, and a runtime one is set."""
    from spark_app.runtime.driver import apply_runtime_conf

    session = _FakeSession(started={}, sql={}, static={"spark.sql.extensions"})
    requested = {"spark.sql.extensions": "com.example.Extension", "spark.sql.shuffle.partitions": "8"}
    with caplog.at_level("WARNING", logger="spark_app"):
        apply_runtime_conf(session, {**requested, "spark.hadoop.fs.s3a.connection.maximum": "4"},  # type: ignore[arg-type]
                           requested=requested)
    assert session.sql == {"spark.sql.shuffle.partitions": "8"}
    assert session.hadoop == {"fs.s3a.connection.maximum": "4"}
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "spark.sql.extensions=com.example.Extension" in warned[0], warned


def test_a_launch_setting_the_jvm_started_with_behind_spark_apps_own_is_not_warned_about(
        caplog: pytest.LogCaptureFixture) -> None:
    """The JVM starts with spark_app's class path, java options and library path ahead of the
    user's (launch.AHEAD_OF_THE_USERS): the user's value took effect, and was named in a
    warning as come too late because the started value is not the user's alone."""
    from spark_app.runtime.driver import apply_runtime_conf

    requested = {"spark.driver.extraClassPath": "/opt/jdbc.jar", "spark.driver.defaultJavaOptions": "-Xss4m",
                 "spark.driver.memory": "8g"}
    started = {"spark.driver.extraClassPath": "/jars/*:/opt/jdbc.jar",
               "spark.driver.defaultJavaOptions": "-Djava.io.tmpdir=/tmp/x -Xss4m", "spark.driver.memory": "2g"}
    session = _FakeSession(started=started, sql={}, static=set())
    with caplog.at_level("WARNING", logger="spark_app"):
        apply_runtime_conf(session, requested, requested=requested)  # type: ignore[arg-type]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "spark.driver.memory=8g" in warned[0], warned
