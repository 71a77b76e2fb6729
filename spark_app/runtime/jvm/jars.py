"""The folder of JVM packages a driver adds to Spark's own (Delta Lake, hadoop-aws, the AWS
SDK, spark-hadoop-cloud, the project's own LogStore): installed by `make jars`, named by
$SPARK_APP_JARS_DIR in the images."""

from __future__ import annotations

import glob
import os
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
