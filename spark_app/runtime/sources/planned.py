"""spark_app's own stream readers, planned in the driver's Python process and read by
Spark's Python workers (the JVM half is tools/jars/java/dev/sparkapp/sources/PlannedSource).

A Spark Python data source plans in Python processes of Spark's own: one that creates the
source, one per stream that plans its batches, one that prepares its read, each started
when a query starts and each importing pyspark and the source's modules before the first
batch. That was most of a spark_app driver's start beyond plain Structured Streaming's
(1.4 s). Here the same reader (a ``CountingReader``) runs in the driver, which has all of
that loaded already: Spark's JVM stream calls it through Py4J's callback server, as it
calls a foreachBatch function, and each row the stream yields is one input partition,
pickled, which ``mapInArrow`` hands to a worker that reads it. A partition therefore
carries everything its read needs (``ReadsItself``).
"""

from __future__ import annotations

import base64
import json
import pickle
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from spark_app.runtime.jvm.map_in_arrow import map_in_arrow
from spark_app.runtime.sources.reader import CountingReader, ReadsItself

SOURCE_CLASS = "dev.sparkapp.sources.PlannedSource"


class DriverPlanner:
    """A source's planner, called by each JVM stream of it (``dev.sparkapp.sources.Planner``):
    one reader per stream, made by ``new_reader`` at the stream's first call (when the
    pipeline's context, which the reader reads, is written)."""

    class Java:
        implements = ["dev.sparkapp.sources.Planner"]

    def __init__(self, new_reader: Callable[[], CountingReader]) -> None:
        self._new_reader = new_reader
        self._readers: dict[str, CountingReader] = {}
        self._lock = threading.Lock()

    def _reader(self, stream: str) -> CountingReader:
        with self._lock:
            reader = self._readers.get(stream)
            if reader is None:
                reader = self._readers[stream] = self._new_reader()
            return reader

    def initialOffset(self, stream: str) -> str:  # noqa: N802 - the Java interface's name
        return json.dumps(self._reader(stream).initialOffset())

    def latestOffset(self, stream: str) -> str:  # noqa: N802 - the Java interface's name
        return json.dumps(self._reader(stream).latestOffset())

    def seen(self, stream: str, offset: str) -> None:
        end = json.loads(offset)
        self._reader(stream).plan_range(end, end)

    def partitions(self, stream: str, start: str, end: str) -> str:
        planned = self._reader(stream).partitions(json.loads(start), json.loads(end))
        return "\n".join(base64.b64encode(pickle.dumps(p, protocol=5)).decode("ascii") for p in planned)

    def close(self, stream: str) -> None:
        with self._lock:
            self._readers.pop(stream, None)


def planned_stream(spark: SparkSession, new_reader: Callable[[], CountingReader], schema: StructType,
                   options: Mapping[str, str]) -> DataFrame:
    """A streaming DataFrame of ``schema``: the rows the readers ``new_reader`` makes plan
    and read. ``options`` show in the query's plan (``persistent_id`` names the source)."""
    from pyspark.java_gateway import ensure_callback_server_started

    gateway, jvm = spark.sparkContext._gateway, spark.sparkContext._jvm
    assert gateway is not None and jvm is not None
    ensure_callback_server_started(gateway)
    planner_id = uuid.uuid4().hex
    jvm.dev.sparkapp.sources.Planners.register(planner_id, DriverPlanner(new_reader))
    raw = spark.readStream.format(SOURCE_CLASS).option("planner", planner_id).options(**options).load()
    return map_in_arrow(raw, read_partitions, schema)


def read_partitions(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """In a task: the rows of each partition the planned stream yields."""
    for batch in batches:
        for payload in batch.column(0).to_pylist():
            partition = pickle.loads(payload)
            assert isinstance(partition, ReadsItself)
            yield from partition.read()
