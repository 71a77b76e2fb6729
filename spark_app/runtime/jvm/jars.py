"""Where a driver's JVM packages are: Spark's own (its home), and the folder of those a
driver adds (Delta Lake, hadoop-aws, the AWS SDK, spark-hadoop-cloud, the project's own
LogStore): installed by `make jars`, named by $SPARK_APP_JARS_DIR in the images."""

from __future__ import annotations

import glob
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

from spark_app.contract import JARS_DIR as JARS_DIR_ENV

_REPOSITORY = Path(__file__).resolve().parents[3]


def jars_dir() -> str:
    """$SPARK_APP_JARS_DIR, else the repository's .cache/jars."""
    folder = os.environ.get(JARS_DIR_ENV) or str(_REPOSITORY / ".cache" / "jars")
    if not glob.glob(os.path.join(folder, "*.jar")):
        raise RuntimeError(
            f"no JVM packages found in {folder}: run `make jars`, or set {JARS_DIR_ENV} "
            "to the folder holding Delta Lake and hadoop-aws"
        )
    return os.path.realpath(folder)


def spark_home(environ: Mapping[str, str] = os.environ) -> str | None:
    """Spark's folder (its scripts and jars) by pyspark's rule for an installed pyspark:
    $SPARK_HOME, else the package's ``spark-distribution`` or the package itself. Found
    without importing pyspark, which costs a driver's start 0.3 s or more. None if neither
    holds Spark."""
    if "SPARK_HOME" in environ:
        return environ["SPARK_HOME"]
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    package = os.path.dirname(spec.origin)
    for home in (os.path.join(package, "spark-distribution"), package):
        if os.path.isfile(os.path.join(home, "bin", "spark-submit")) and os.path.isdir(os.path.join(home, "jars")):
            return home
    return None
