"""The session's configuration, as spark_conf builds it (no Spark started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_app.persistence import Backend
from spark_app.runtime.jvm.session import DELTA_S3_LOG_STORE, spark_conf

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
