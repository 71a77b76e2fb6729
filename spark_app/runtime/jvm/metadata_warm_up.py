"""Spark's checkpoint metadata read once beside a resumed driver's start.

A query that resumes reads its commit log as it starts, and each of its RocksDB state
stores reads its snapshot's metadata in the first task that loads it. Spark reads both
with json4s, whose first extraction of a class in a JVM parses the class's Scala signature
with code that runs cold: 0.3 to 0.4 s of CPU in the first state store task on each core,
which was the largest part of what a 1M-key state added to a start (bench/README.md). The
JVM half (tools/jars/java/dev/sparkapp/state/CheckpointMetadataWarmUp) reads a sample of
each in a thread of its own, once per JVM, so the queries find the descriptions cached.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyspark.sql import SparkSession

from spark_app.runtime.jvm.conf import ROCKSDB_PROVIDER, STATE_STORE_PROVIDER


def start(spark: SparkSession, resumed_stateful: Iterable[bool]) -> Any:
    """Starts the reads if any query resumes (``resumed_stateful``: whether each resuming
    query keeps state); the state stores' only if one of them does, in RocksDB. Returns the
    JVM's future of the reads, or None when no query resumes."""
    stateful = list(resumed_stateful)
    if not stateful:
        return None
    stores = any(stateful) and spark.conf.get(STATE_STORE_PROVIDER, None) == ROCKSDB_PROVIDER
    return spark.sparkContext._jvm.dev.sparkapp.state.CheckpointMetadataWarmUp.start(stores)  # type: ignore[union-attr]
