"""Building the SparkSession that runs a pipeline: its configuration (``conf``) on the JVM
the driver started for it (``launch``), pyspark's converters without pandas, and no
needless lookup of Python data sources. Also how a session reaches another bucket.
"""

from __future__ import annotations

import logging
import os
import pkgutil
import sys
from collections.abc import Mapping
from typing import Any

from py4j import protocol
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql import types as spark_types

from spark_app import contract
from spark_app.persistence import Backend
from spark_app.runtime.jvm import launch
from spark_app.runtime.jvm.conf import s3a_conf
from spark_app.storage import S3Location

log = logging.getLogger("spark_app")


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
    """Starts (or returns) the process's SparkSession with ``conf``, on the JVM the driver
    started early for it (``launch.start_early``) if there is one."""
    _convert_numpy_without_pandas()
    new_jvm = SparkContext._gateway is None  # pyspark keeps its JVM for the process's life
    early = None
    if new_jvm:
        early = launch.take(conf)
    else:  # a session of the pipeline's own started a JVM: the early one is not needed
        launch.discard()
    jvm_launch = early.launch if early is not None else launch.prepare(conf, new_jvm)
    builder = SparkSession.builder
    for key, value in jvm_launch.settings.items():
        builder = builder.config(key, value)
    if early is not None:
        _take_over(early)
    # What the JVM alone is to see, in the environment pyspark starts it with.
    os.environ.update(jvm_launch.environment)
    try:
        session = builder.getOrCreate()
    finally:
        for name in jvm_launch.environment:
            os.environ.pop(name, None)
    session.sparkContext.setLogLevel(log_level)
    _skip_needless_data_source_lookup(session)
    return session


def _take_over(early: launch.EarlyJvm) -> None:
    """Connects pyspark to a JVM this process started, as pyspark connects to the JVM that
    spark-submit started for a Python application: through the gateway's port and secret in
    its environment (read by its launch_gateway). The two variables are taken out again, so
    no process this one starts sees them. Should that JVM have ended, pyspark starts one."""
    connection = early.connection()
    if connection is None:
        log.warning("the JVM started early for the session ended (exit %s); starting another",
                    early.process.returncode)
        return
    port, secret = connection
    os.environ.update({"PYSPARK_GATEWAY_PORT": str(port), "PYSPARK_GATEWAY_SECRET": secret})
    try:
        SparkContext._ensure_initialized()
    finally:
        os.environ.pop("PYSPARK_GATEWAY_PORT", None)
        os.environ.pop("PYSPARK_GATEWAY_SECRET", None)
    # As pyspark's own launch keeps it: the process, whose stdin pipe keeps the JVM alive.
    SparkContext._gateway.proc = early.process  # type: ignore[union-attr]


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
