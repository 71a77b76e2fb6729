"""spark-app-python: Spark's workers import the installed pyspark, not Spark's zipped copy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark

from spark_app.runtime.jvm.worker_python import (
    LAUNCHER_NAME,
    installed_pyspark_dirs,
    without_bundled_copies,
    worker_python,
)

INSTALLED = Path(pyspark.__file__).parent
# What Spark puts first on a worker's PYTHONPATH (PythonUtils.sparkPythonPath).
SPARK_PATH = [
    str(INSTALLED / "python" / "lib" / "pyspark.zip"),
    next(str(p) for p in (INSTALLED / "python" / "lib").glob("py4j-*-src.zip")),
    next(str(p) for p in (INSTALLED / "jars").glob("spark-core_*.jar")),
]


def test_drops_the_copies_inside_the_installed_package_and_keeps_the_rest_in_order(tmp_path: Path) -> None:
    mine, theirs = str(tmp_path / "deps.zip"), "/opt/spark-3/python/lib/pyspark.zip"
    path = os.pathsep.join([*SPARK_PATH, mine, theirs, ""])
    assert without_bundled_copies(path, [str(INSTALLED)]) == os.pathsep.join([mine, theirs, ""])


def test_keeps_everything_when_pyspark_is_not_installed() -> None:
    path = os.pathsep.join(SPARK_PATH)
    assert without_bundled_copies(path, []) == path


def test_finds_the_pyspark_this_interpreter_imports() -> None:
    assert [os.path.realpath(d) for d in installed_pyspark_dirs()] == [os.path.realpath(INSTALLED)]


def test_the_launcher_runs_workers_on_the_installed_pyspark() -> None:
    launcher = worker_python()
    assert Path(launcher).name == LAUNCHER_NAME, "run `make venv`: the package's console scripts are missing"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(SPARK_PATH)}
    probe = "import os, sys, pyspark; print(pyspark.__file__); print(os.environ['PYTHONPATH'])"
    plain = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert ".zip" in plain.stdout.splitlines()[0]  # what Spark's workers import without the launcher
    launched = subprocess.run([launcher, "-c", probe], env=env, capture_output=True, text=True, check=True)
    imported, pythonpath = launched.stdout.splitlines()
    assert Path(imported).parent.resolve() == INSTALLED.resolve()
    assert pythonpath == ""
