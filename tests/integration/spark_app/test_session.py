"""The session spark_app builds: what its Python workers run on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from spark_app.persistence import Backend
from spark_app.runtime.session import build_session, spark_conf

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield build_session(spark_conf(Backend.filesystem("/tmp"), 10_000,
                                   {"spark.master": "local[2]", "spark.ui.enabled": "false"}))


def test_python_workers_import_the_installed_pyspark_rather_than_sparks_zipped_copy(spark: SparkSession) -> None:
    def probe(_: object) -> Iterator[tuple[str, list[str]]]:
        import sys

        import pyspark as worker_pyspark

        yield worker_pyspark.__file__, sys.path

    [(imported, path)] = spark.sparkContext.parallelize([0], 1).mapPartitions(probe).collect()
    installed = Path(pyspark.__file__).parent.resolve()
    assert Path(imported).parent.resolve() == installed
    assert not [entry for entry in path if Path(entry).resolve().is_relative_to(installed)]
