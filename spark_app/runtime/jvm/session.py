"""Building the SparkSession that runs a pipeline.

Everything spark_app relies on is set here, once: the JVM packages (Delta Lake,
hadoop-aws, spark-hadoop-cloud), the RocksDB state store with changelog checkpointing,
the snapshot interval, S3A settings for an S3 backend (without credentials: S3A reads
the standard AWS variables), Delta's commits on S3 with put-if-absent, and the Python
that workers run.
"""

from __future__ import annotations

import logging
import os
import pkgutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from py4j import protocol
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql import types as spark_types

from spark_app import contract
from spark_app.persistence import Backend
from spark_app.runtime import scratch
from spark_app.runtime.jvm import class_archive, state_stores
from spark_app.runtime.jvm.jars import jars_dir
from spark_app.runtime.jvm.worker_python import worker_python
from spark_app.storage import S3Location

log = logging.getLogger("spark_app")

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
ABORTABLE_CHECKPOINT_MANAGER = "org.apache.spark.internal.io.cloud.AbortableStreamBasedCheckpointFileManager"
# tools/jars/java/dev/sparkapp/delta/S3PutIfAbsentLogStore.java, compiled by `make jars`.
DELTA_S3_LOG_STORE = "dev.sparkapp.delta.S3PutIfAbsentLogStore"
# tools/jars/java/dev/sparkapp/fs: local files with their permissions set in-process.
LOCAL_FILE_SYSTEM = "dev.sparkapp.fs.NioLocalFileSystem"
LOCAL_FS = "dev.sparkapp.fs.NioLocalFs"
FAIR_SCHEDULER_POOLS = Path(__file__).with_name("fairscheduler.xml")
"""The pools of the fair scheduler, shipped with the package (the wheel carries it)."""

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
    # A store snapshots at least every 10 versions, and its last version once the snapshot
    # interval has passed (state_stores.snapshot_now); the maintenance interval (the
    # snapshot interval too) uploads what it snapshotted.
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": str(state_stores.MIN_DELTAS_FOR_SNAPSHOT),
    "spark.sql.streaming.minBatchesToRetain": "100",
    "spark.ui.showConsoleProgress": "false",
    # Jobs in the default pool keep their one queue (first in, first out); a backfill reads
    # its chunks in a pool of its own (sources/delta_table.py: read_aside), shared task by
    # task with the default pool, so a long chunk read does not hold up the live changes.
    "spark.scheduler.mode": "FAIR",
    "spark.scheduler.allocation.file": str(FAIR_SCHEDULER_POOLS),
    # Delta rebuilds a table's snapshot from its log with this many tasks (50 by default);
    # the logs here are small, and 50 tasks cost seconds per read on a small driver.
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    # Delta refuses to read any version but the latest once its commit is older than the
    # table's deletedFileRetentionDuration, whether or not its files are still there. A
    # shared table keeps tombstones for a minute (tables/publish.py) and its versions for
    # as long as a reader's hold needs them, so a reader that lagged a minute was refused
    # versions it held. Reads of versions whose files are gone still fail, and the
    # readers report them as gone (sources/delta_table.py: _translate).
    "spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration": "false",
    # A Delta version on s3a:// is committed by creating its log file only if absent (S3's
    # If-None-Match: *), so two drivers cannot both commit it; Delta's own store for s3a
    # checks, then writes (delta-io/delta#3596). The store needs S3A's conditional create
    # (HADOOP-19256). In every session, not only those with S3 state: a pipeline may write
    # a Delta table to S3 whatever its state backend.
    "spark.delta.logStore.s3a.impl": DELTA_S3_LOG_STORE,
    "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
    # Without Hadoop's native library, Hadoop set each local file's permissions with a
    # chmod process: a state store's first load copies every RocksDB file of its snapshot
    # (1,000 per partition after 1,000 batches of keys that arrive in order), and took 25 s.
    "spark.hadoop.fs.file.impl": LOCAL_FILE_SYSTEM,
    "spark.hadoop.fs.AbstractFileSystem.file.impl": LOCAL_FS,
}


def spark_conf(snapshot: Backend, snapshot_interval_ms: int, extra: Mapping[str, str]) -> dict[str, str]:
    """The complete configuration for a pipeline's session. Pure: tests call it directly."""
    conf = dict(_DEFAULTS)
    conf["spark.sql.streaming.stateStore.maintenanceInterval"] = f"{snapshot_interval_ms}ms"
    if snapshot.kind == "s3":
        conf.update(s3a_conf(snapshot))
        # Spark's checkpoint written in place, not under a temporary name then copied and
        # deleted (a rename on S3). Spark reads the setting from the Hadoop configuration
        # (CheckpointFileManager.create), where it can still be set once the session runs:
        # as a SQL setting it cannot, and a pipeline whose state is named in run(), after
        # its sources built the session, lost it.
        conf["spark.hadoop.spark.sql.streaming.checkpointFileManagerClass"] = ABORTABLE_CHECKPOINT_MANAGER
    conf.update(extra)
    return conf


def s3a_conf(backend: Backend) -> dict[str, str]:
    conf = {
        "spark.hadoop.fs.s3a.aws.credentials.provider":
            "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
        "spark.hadoop.fs.s3a.path.style.access": "true" if backend.path_style else "false",
        # S3A rides out a short blip (about 15 s of retries of a failed connection); a longer
        # outage fails the query, which the driver restarts for its outage budget, and then
        # the operator relaunches the driver until storage is back (README: reliability).
        "spark.hadoop.fs.s3a.retry.limit": "5",
        "spark.hadoop.fs.s3a.retry.interval": "500ms",
        "spark.hadoop.fs.s3a.attempts.maximum": "3",
        "spark.hadoop.fs.s3a.connection.establish.timeout": "5s",
        "spark.hadoop.fs.s3a.connection.timeout": "60s",
        "spark.hadoop.fs.s3a.committer.magic.enabled": "true",
    }
    if backend.endpoint_url:
        conf["spark.hadoop.fs.s3a.endpoint"] = backend.endpoint_url
        # An S3-compatible server: local files (a RocksDB state store's snapshot files) go
        # up through S3A's output stream, as every other write, not the SDK's asynchronous
        # transfer, which the local S3 server (moto's) answers with an error (S3Exception,
        # status 100): every snapshot upload failed, silently (Spark ignores a maintenance
        # error), and each start replayed the state's changelog from its first version.
        conf["spark.hadoop.fs.s3a.optimized.copy.from.local.enabled"] = "false"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(backend.endpoint_url.startswith("https")).lower()
    if backend.region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = backend.region
    elif backend.endpoint_url:
        # S3-compatible servers ignore the region, but the AWS SDK v2 insists on one.
        conf["spark.hadoop.fs.s3a.endpoint.region"] = "us-east-1"
    return conf


def reach_bucket(spark: SparkSession, backend: Backend, keys: contract.S3Keys | None = None) -> None:
    """Lets S3A reach ``backend``'s bucket as ``backend`` says (its endpoint, addressing and
    region), with ``keys`` if given, whatever the session's own S3 settings are: they are
    set for that bucket only (``fs.s3a.bucket.<name>.*``). Nothing to do for a folder."""
    if backend.kind != "s3":
        return
    bucket = S3Location.parse(backend.root).bucket
    hadoop: Any = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_conf(backend).items():
        hadoop.set(f"fs.s3a.bucket.{bucket}.{key.removeprefix('spark.hadoop.fs.s3a.')}", value)
    if keys is not None:
        provider = ("org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider" if keys.session_token
                    else "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider")
        hadoop.set(f"fs.s3a.bucket.{bucket}.aws.credentials.provider", provider)
        hadoop.set(f"fs.s3a.bucket.{bucket}.access.key", keys.access_key_id)
        hadoop.set(f"fs.s3a.bucket.{bucket}.secret.key", keys.secret_access_key)
        if keys.session_token:
            hadoop.set(f"fs.s3a.bucket.{bucket}.session.token", keys.session_token)


def build_session(conf: Mapping[str, str], log_level: str = "WARN") -> SparkSession:
    """Starts (or returns) the process's SparkSession with ``conf``."""
    # Spark starts its Python workers with PYSPARK_PYTHON, and looks Python data sources up
    # with PYSPARK_DRIVER_PYTHON; see spark_app.runtime.jvm.worker_python.
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", worker_python())
    _convert_numpy_without_pandas()
    # On the class path rather than in spark.jars: spark.jars copies every jar (the AWS SDK
    # bundle alone is 600 MB) into a temporary folder per driver, which a killed driver
    # leaves behind.
    jars = jars_dir()
    classpath = os.path.join(jars, "*")
    builder = (SparkSession.builder.config("spark.driver.extraClassPath", classpath)
               .config("spark.executor.extraClassPath", classpath))
    # In Kubernetes execution, executors are built from the operator's pod template.
    settings = {**conf, **contract.executor_pod_template_conf(os.environ, tempfile.gettempdir())}
    local_dir = None
    if "spark.local.dir" not in settings and not os.environ.get("SPARK_LOCAL_DIRS"):
        # Spark's local folder (shuffle blocks, the state stores' working copies) is a
        # scratch folder, which the next driver on this disk removes if this one is killed.
        # Its lock stays held for the process's life; a clean exit removes it. Given to the
        # JVM alone, in the environment it starts with (Spark warns of spark.local.dir
        # whenever it is set; processes this one starts later make their own).
        local_dir = scratch.process_folder("spark")
        os.environ["SPARK_LOCAL_DIRS"] = local_dir
    # The JVM's temporary folder is a scratch folder too: each start writes the native
    # libraries of RocksDB (15 MB), LZ4 and Snappy there, and Spark its artifact folders; a
    # killed driver left them all behind (1.1 GB of RocksDB's alone in /tmp on this
    # project's test machine after a day). A user's own java.io.tmpdir, in
    # extraJavaOptions, comes later on the command line and wins.
    if SparkContext._active_spark_context is None:  # else no JVM starts, and none takes options
        jvm_tmp = scratch.process_folder("jvm")
        # Ahead of the user's own options (defaultJavaOptions precede extraJavaOptions).
        own = settings.get("spark.driver.defaultJavaOptions", "")
        settings["spark.driver.defaultJavaOptions"] = " ".join(
            filter(None, (class_archive.java_options(jars), f"-Djava.io.tmpdir={jvm_tmp}", own)))
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    finally:
        if local_dir is not None:
            os.environ.pop("SPARK_LOCAL_DIRS", None)
    session.sparkContext.setLogLevel(log_level)
    _skip_needless_data_source_lookup(session)
    return session


class _NumpyScalars(spark_types.NumpyScalarConverter):
    """pyspark's converter of numpy scalars, without its import of pandas.

    pyspark's numpy converters ask ``pyspark.testing.utils`` whether numpy is installed, and
    importing it imports pandas, unittest and difflib: on a driver's first Java call with an
    argument, 0.3 to 0.4 s of its start on the test machine, for modules a pipeline does not
    use (see runtime/jvm/map_in_arrow.py). An object is numpy's only if numpy is loaded,
    which ``sys.modules`` says at no cost."""

    def can_convert(self, obj: Any) -> bool:
        numpy = sys.modules.get("numpy")
        return numpy is not None and isinstance(obj, numpy.generic)


class _NumpyArrays(spark_types.NumpyArrayConverter):
    """pyspark's converter of one-dimensional numpy arrays, without its import of pandas."""

    def can_convert(self, obj: Any) -> bool:
        numpy = sys.modules.get("numpy")
        return numpy is not None and isinstance(obj, numpy.ndarray) and obj.ndim == 1


def _convert_numpy_without_pandas() -> None:
    """Puts the converters above in place of pyspark's in py4j's list (idempotent)."""
    ours: dict[type, type] = {spark_types.NumpyScalarConverter: _NumpyScalars,
                              spark_types.NumpyArrayConverter: _NumpyArrays}
    protocol.INPUT_CONVERTER[:] = [ours[type(c)]() if type(c) in ours else c for c in protocol.INPUT_CONVERTER]


def _skip_needless_data_source_lookup(spark: SparkSession) -> None:
    """Spares the driver's first use of a Python data source a Python process that finds nothing.

    Before it first resolves a data source's name, Spark starts a Python daemon and a worker
    to look for modules named ``pyspark_*`` on the workers' path, whose ``DefaultSource``
    it registers by their names: a process start on the way to every driver's first batch.
    When this interpreter's own path has no such module, the lookup would register nothing,
    so Spark is told it was done (its record of registered sources, a static of Spark 4.1's
    DataSourceManager, set to none). A path with one is left to Spark, and so is a Spark
    without that record. (A ``pyspark_*`` module shipped later with ``addPyFile`` is not
    registered by its name; ``spark.dataSource.register`` still registers it.)
    """
    if any(module.name.startswith("pyspark_") for module in pkgutil.iter_modules()):
        return
    jvm: Any = spark.sparkContext._jvm
    try:
        # The companion object's own accessors: Scala makes no static forwarders for them.
        manager = getattr(getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSourceManager$"), "MODULE$")
        if manager.dataSourceBuilders().isEmpty():
            none = jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(jvm.java.util.HashMap())
            getattr(manager, "dataSourceBuilders_$eq")(jvm.scala.Some(none))
    except Exception as error:  # noqa: BLE001 - an optimisation: Spark looks the sources up itself
        log.info("the Python data source lookup is left to Spark: %s", error)
