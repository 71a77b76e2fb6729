"""Building the SparkSession that runs a pipeline.

Everything spark_app relies on is set here, once: the JVM packages (Delta Lake,
hadoop-aws, spark-hadoop-cloud), the RocksDB state store with changelog checkpointing,
the snapshot interval, S3A settings for an S3 backend (without credentials: S3A reads
the standard AWS variables), and the Python that workers run.
"""

from __future__ import annotations

import glob
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from spark_app import contract
from spark_app.persistence import Backend
from spark_app.runtime import class_archive
from spark_app.runtime.worker_python import worker_python

log = logging.getLogger("spark_app")

JARS_DIR_ENV = "SPARK_APP_JARS_DIR"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
ABORTABLE_CHECKPOINT_MANAGER = "org.apache.spark.internal.io.cloud.AbortableStreamBasedCheckpointFileManager"

_DEFAULTS = {
    "spark.master": "local[*]",
    "spark.app.name": "spark_app",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.session.timeZone": "UTC",
    # Fixed into a stateful query's checkpoint on its first batch; small suits one driver.
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # A snapshot becomes due after every committed version; the maintenance interval
    # (the snapshot interval) then decides how often one is actually uploaded.
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "1",
    "spark.sql.streaming.minBatchesToRetain": "100",
    "spark.ui.showConsoleProgress": "false",
    # Delta rebuilds a table's snapshot from its log with this many tasks (50 by default);
    # the logs here are small, and 50 tasks cost seconds per read on a small driver.
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
}


def jars_dir() -> str:
    """The folder of extra JVM packages: $SPARK_APP_JARS_DIR, else the repository's .cache/jars."""
    folder = os.environ.get(JARS_DIR_ENV) or str(Path(__file__).resolve().parents[2] / ".cache" / "jars")
    if not glob.glob(os.path.join(folder, "*.jar")):
        raise RuntimeError(
            f"no JVM packages found in {folder}: run `make jars`, or set {JARS_DIR_ENV} "
            "to the folder holding Delta Lake and hadoop-aws"
        )
    return os.path.realpath(folder)


def spark_conf(snapshot: Backend, snapshot_interval_ms: int, extra: Mapping[str, str]) -> dict[str, str]:
    """The complete configuration for a pipeline's session. Pure: tests call it directly."""
    conf = dict(_DEFAULTS)
    conf["spark.sql.streaming.stateStore.maintenanceInterval"] = f"{snapshot_interval_ms}ms"
    if snapshot.kind == "s3":
        conf.update(s3a_conf(snapshot))
        conf["spark.sql.streaming.checkpointFileManagerClass"] = ABORTABLE_CHECKPOINT_MANAGER
    conf.update(extra)
    return conf


def s3a_conf(backend: Backend) -> dict[str, str]:
    conf = {
        "spark.hadoop.fs.s3a.aws.credentials.provider":
            "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
        "spark.hadoop.fs.s3a.path.style.access": "true" if backend.path_style else "false",
        "spark.hadoop.fs.s3a.retry.limit": "10",
        "spark.hadoop.fs.s3a.attempts.maximum": "5",
        "spark.hadoop.fs.s3a.committer.magic.enabled": "true",
    }
    if backend.endpoint_url:
        conf["spark.hadoop.fs.s3a.endpoint"] = backend.endpoint_url
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(backend.endpoint_url.startswith("https")).lower()
    if backend.region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = backend.region
    elif backend.endpoint_url:
        # S3-compatible servers ignore the region, but the AWS SDK v2 insists on one.
        conf["spark.hadoop.fs.s3a.endpoint.region"] = "us-east-1"
    return conf


def build_session(conf: Mapping[str, str]) -> SparkSession:
    """Starts (or returns) the process's SparkSession with ``conf``."""
    # Spark starts its Python workers with PYSPARK_PYTHON, and looks Python data sources up
    # with PYSPARK_DRIVER_PYTHON; see spark_app.runtime.worker_python.
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", worker_python())
    # On the class path rather than in spark.jars: spark.jars copies every jar (the AWS SDK
    # bundle alone is 600 MB) into a temporary folder per driver, which a killed driver
    # leaves behind.
    jars = jars_dir()
    classpath = os.path.join(jars, "*")
    builder = (SparkSession.builder.config("spark.driver.extraClassPath", classpath)
               .config("spark.executor.extraClassPath", classpath))
    # In Kubernetes execution, executors are built from the operator's pod template.
    settings = {**conf, **contract.executor_pod_template_conf(os.environ, tempfile.gettempdir())}
    archive = class_archive.java_options(jars)
    if archive:
        # Ahead of the user's own options (defaultJavaOptions precede extraJavaOptions).
        own = settings.get("spark.driver.defaultJavaOptions", "")
        settings["spark.driver.defaultJavaOptions"] = f"{archive} {own}".strip()
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("SPARK_APP_SPARK_LOG_LEVEL", "WARN"))
    return session
