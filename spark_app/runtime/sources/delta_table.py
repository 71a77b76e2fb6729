"""A keyed Delta table as a source: backfilled in key order while its changes follow.

Three parts, each on its side of Spark:

- ``DeltaTableView`` reads the table for the backfill's algebra
  (spark_app.runtime.sources.backfill): its newest version from the transaction log, its
  changes from the change data feed, chunks in key order at a version.
- The ``Planner``, a thread of the driver, turns the table into numbered plans, each a
  Parquet file in the reader's state (``backfill/<persistent id>/plans/``) that carries
  the ``Frontier`` it reaches. A plan is created only if absent, so two drivers never
  write two different plans of one number, and it never changes: replaying a batch reads
  the same rows. The planner stays at most ``lookahead`` plans ahead of the reader's
  commits (so what waits on storage is bounded) and removes plans once committed.
- ``PlanStreamReader``, planned in the driver like a file source
  (spark_app.runtime.sources.planned), hands the plans to the query in order; its offset
  is the number of plans read and commits with the batch like a file source's.
"""

from __future__ import annotations

import datetime
import io
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    DataType,
    DateType,
    IntegerType,
    IntegralType,
    StringType,
    StructField,
    StructType,
)

from spark_app.contract import S3Keys
from spark_app.persistence import Backend
from spark_app.runtime.sources.backfill import (
    Behind,
    Changes,
    Chunk,
    FileRange,
    Frontier,
    Plan,
    Position,
    Progress,
    RateMeter,
    ReadAhead,
    TokenBucket,
    chunk_bound,
    next_plan,
    progress,
)
from spark_app.runtime.sources.base import Offset
from spark_app.runtime.sources.reader import CountingReader
from spark_app.storage import NotFound, RetryPolicy, Storage, join

log = logging.getLogger("spark_app")

DIFF = "diff"
_VERSION = "__spark_app_version"
READ_ASIDE_POOL = "spark_app_backfill"
_FRONTIER_KEY = b"spark_app.backfill.frontier"
_VERSION_FILE = re.compile(r"^_delta_log/(\d{20})\.json$")
_BOUNDED_TYPES = (IntegralType, StringType, DateType)
"""First key columns whose position, as JSON, compares with their statistics as read back."""
_RANGES_REFRESH = 20
"""Versions after which a view reads its table's file statistics again."""
SAVED_ALLOWANCE_S = 2.5
"""Seconds of a rate limit a rate-limited planner may save up: a slow read is made up after
it, and over a minute the rate held is within 2.5 / 60 = 4.2% of the limit (or a chunk's worth
where a chunk is more)."""


class BackfillError(Exception):
    """The table cannot be read as asked (missing, no change data feed, versions gone)."""


@dataclass(frozen=True)
class BackfillSettings:
    chunk_rows: int = 100_000
    """The most rows of the table one plan reads."""
    rows_per_second: float | None = None
    """The rate the table is read at; None: as fast as the reader takes it, 0: paused."""
    lookahead: int = 2
    """Plans written ahead of the reader's commits."""
    max_plans_per_trigger: int = 1
    """Plans in one batch of the reader: a kill re-reads at most this many chunks."""

    def __post_init__(self) -> None:
        if self.chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, got {self.chunk_rows}")
        if self.rows_per_second is not None and self.rows_per_second < 0:
            raise ValueError(f"rows_per_second must be 0 (paused) or more, got {self.rows_per_second}")
        if self.lookahead < 1 or self.max_plans_per_trigger < 1:
            raise ValueError("lookahead and max_plans_per_trigger must be at least 1")


# ---- the plans, in the reader's state -------------------------------------------------------


class PlanStore:
    """The plan files of one source, numbered from 1."""

    def __init__(self, storage: Storage, persistent_id: str) -> None:
        self._storage = storage
        self._folder = join("backfill", persistent_id, "plans") + "/"
        self._versions: dict[int, int | None] = {}
        """The version each plan reached, as written or read here (a plan never changes)."""

    def key(self, number: int) -> str:
        return f"{self._folder}{number:012d}.parquet"

    def numbers(self) -> list[int]:
        return sorted(int(k[len(self._folder):].split(".")[0]) for k in self._storage.list(self._folder)
                      if k.endswith(".parquet"))

    def newest(self) -> int:
        numbers = self.numbers()
        return numbers[-1] if numbers else 0

    def frontier(self, number: int | None = None) -> Frontier:
        """Where plan ``number`` (by default the newest) left the backfill; the start if
        there is no plan yet. Raises NotFound for a plan that is not stored."""
        number = self.newest() if number is None else number
        if not number:
            return Frontier()
        metadata = pq.read_schema(io.BytesIO(self._storage.read(self.key(number)))).metadata or {}
        return Frontier.from_json(metadata[_FRONTIER_KEY].decode())

    def version(self, number: int) -> int | None:
        """The table version plan ``number`` reached; None if that plan is not stored. Known
        without a read for the plans this store wrote (a reader's hold asks at each commit)."""
        version = self._versions.get(number)
        if version is not None:
            return version
        try:
            version = self._versions[number] = self.frontier(number).version
        except NotFound:
            return None
        return version

    def create(self, rows: pa.Table, frontier: Frontier) -> bool:
        """Stores plan ``frontier.plans`` unless it exists; returns whether it did."""
        buffer = io.BytesIO()
        schema = rows.schema.with_metadata({_FRONTIER_KEY: frontier.to_json().encode()})
        pq.write_table(rows.replace_schema_metadata(schema.metadata), buffer)
        created = self._storage.create(self.key(frontier.plans), buffer.getvalue())
        if created:
            self._versions[frontier.plans] = frontier.version
        return created

    def read(self, number: int) -> pa.Table:
        return pq.read_table(io.BytesIO(self._storage.read(self.key(number))))

    def drop_before(self, number: int) -> None:
        for old in [n for n in list(self._versions) if n < number]:  # a copy: a hold may add one meanwhile
            self._versions.pop(old, None)
        for old in self.numbers():
            if old >= number:
                return
            self._storage.delete(self.key(old))


# ---- the table --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeltaTableRef:
    """A Delta table read by key: where it is and which columns identify a row."""

    location: Backend
    key: tuple[str, ...]
    keys: S3Keys | None = field(default=None, repr=False)
    """S3 credentials of the table's own (a shared table's), if not the driver's."""

    def storage(self, retry: RetryPolicy | None = None) -> Storage:
        return self.location.storage(retry or RetryPolicy(), keys=self.keys)

    @property
    def uri(self) -> str:
        return self.storage().spark_uri("")

    def latest_version(self, storage: Storage | None = None) -> int:
        """The newest committed version, from the transaction log's file names (no Spark job)."""
        names = (storage or self.storage()).list("_delta_log/")
        versions = [int(m.group(1)) for m in map(_VERSION_FILE.match, names) if m]
        if not versions:
            raise BackfillError(f"no Delta table at {self.location.root}: its _delta_log has no commits")
        return max(versions)


def table_metadata(spark: SparkSession, uri: str) -> tuple[StructType, dict[str, str]]:
    """A Delta table's schema and properties, from one snapshot of its log: no Spark job (a
    new driver's DeltaLog is created here, so its snapshot is the newest)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    snapshot = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, uri).unsafeVolatileSnapshot()
    metadata = snapshot.metadata()
    schema = StructType.fromJson(json.loads(metadata.schemaString()))
    configuration = jvm.scala.jdk.javaapi.CollectionConverters.asJava(metadata.configuration())
    return schema, {str(k): str(configuration.get(k)) for k in configuration.keySet()}


def describe_table(spark: SparkSession, table: DeltaTableRef) -> StructType:
    """The table's schema, after checking that it can be backfilled (keys, change data feed)."""
    table.latest_version()  # raises, naming the location, where there is no table
    schema, properties = table_metadata(spark, table.uri)
    missing = [k for k in table.key if k not in schema.names]
    if missing:
        raise BackfillError(f"the key columns {missing} are not columns of the table at {table.location.root} "
                            f"({', '.join(schema.names)})")
    if DIFF in schema.names:
        raise BackfillError(f"the table at {table.location.root} has a column {DIFF!r}, which the changelog "
                            "it is read as reserves")
    if properties.get("delta.enableChangeDataFeed", "").lower() != "true":
        raise BackfillError(
            f"the table at {table.location.root} does not record its changes: enable its change data feed with "
            f"ALTER TABLE delta.`{table.uri}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
        )
    return schema


def changelog_schema(table_schema: StructType) -> StructType:
    return StructType([*table_schema.fields, StructField(DIFF, IntegerType(), False)])


class DeltaTableView:
    """``backfill.TableView`` over a Delta table, with Arrow tables as rows."""

    def __init__(self, spark: SparkSession, table: DeltaTableRef, schema: StructType,
                 retry: RetryPolicy | None = None) -> None:
        self._spark = spark
        self._table = table
        self._uri = table.uri
        self._storage = table.storage(retry)
        self._columns = [f.name for f in schema.fields]
        types = {f.name: f.dataType for f in schema.fields}
        self._key_types = [(k, types[k]) for k in table.key]
        self._arrow_schema = to_arrow_schema(changelog_schema(schema))
        self._ranges: tuple[int, list[FileRange]] | None = None
        """The data files' statistics, and the version they were read at."""
        self._ranges_unavailable = False

    def latest_version(self) -> int:
        return self._table.latest_version(self._storage)

    def changes(self, after: int, through: int, position: Position, behind: Behind | None = None,
                ) -> Changes[pa.Table]:
        since = after if behind is None else min(after, behind.version)
        options = {"readChangeFeed": "true", "startingVersion": str(since + 1), "endingVersion": str(through)}
        with self._reading(options) as feed:
            change = F.col("_change_type")
            rows = feed.where(change.isin("insert", "delete", "update_preimage", "update_postimage")).select(
                *[F.col(f"`{c}`") for c in self._columns],
                F.when(change.isin("insert", "update_postimage"), 1).otherwise(-1).cast("int").alias(DIFF),
                F.col("_commit_version").alias(_VERSION),
            )
            later = F.col(_VERSION) > F.lit(after) if since < after else F.lit(True)
            # Each part of the split is a condition, or None where it holds for no key, so that
            # no Spark job runs for it (before the first chunk, no key is at or before the position).
            before = self._up_to(position)
            after_it = self._up_to(position, negate=True)
            ahead = None if behind is None else _and(after_it, self._up_to(behind.up_to))
            forwarded_when = _or(_and(later, before), ahead)
            forwarded = self._empty() if forwarded_when is None else self._arrow(rows.where(forwarded_when).drop(_VERSION))
            beyond = 0
            gained = [(w, sign) for w, sign in ((_and(later, after_it), 1), (ahead, -1)) if w is not None]
            if gained:
                total = sum((F.when(w, F.col(DIFF) * sign).otherwise(0) for w, sign in gained), F.lit(0))
                beyond = int(rows.agg(F.coalesce(F.sum(total), F.lit(0))).collect()[0][0])
            return Changes(forwarded, forwarded.num_rows, beyond)

    def chunk(self, version: int, position: Position, limit: int) -> Chunk[pa.Table]:
        with self._reading({"versionAsOf": str(version)}) as rows:
            if position.key is not None:
                rows = rows.where(self._after(position))
            bound = self._bound(version, position, limit)
            table = self._first(rows if bound is None else rows.where(bound), limit)
            if bound is not None and table.num_rows < limit:
                # The statistics counted rows that are not there (deleted since, or files
                # rewritten after the cached statistics): read without the bound, and afresh.
                log.info("backfill: the bound from the table's statistics held %d of %d rows; reading without it",
                         table.num_rows, limit)
                self._ranges = None
                table = self._first(rows, limit)
            last = table.column("_position")[-1].as_py() if table.num_rows else None
            return Chunk(self._conform(table.drop_columns(["_position"])), table.num_rows, last)

    def _first(self, rows: DataFrame, limit: int) -> pa.Table:
        """The first ``limit`` rows in key order, with each row's position (its key as JSON)."""
        keys = [F.col(f"`{k}`") for k in self._table.key]
        return (rows.orderBy(*keys).limit(limit)
                .select(*[F.col(f"`{c}`") for c in self._columns], F.lit(1).cast("int").alias(DIFF),
                        F.to_json(F.struct(*keys)).alias("_position"))).toArrow()

    def _bound(self, version: int, position: Position, limit: int) -> Column | None:
        """A filter ``first key <= v`` that keeps the next chunk whole while the scan skips
        every file above ``v``; None to read to the end. Without it every chunk read every
        row after the position: 7 to 11 s a chunk at the start of a 10M-row table, against
        0.4 to 1.2 s bounded (measured), so a backfill was quadratic in the table's size."""
        name, kind = self._key_types[0]
        if not isinstance(kind, _BOUNDED_TYPES):
            return None
        after = None
        if position.key is not None:
            after = json.loads(position.key).get(name)
            if after is None:
                return None  # a null first key: nulls sort first, and statistics do not order them
            if isinstance(kind, DateType):
                after = datetime.date.fromisoformat(after)
        ranges = self._file_ranges(version)
        high = None if ranges is None else chunk_bound(ranges, after, limit)
        if high is None:
            return None
        column = F.col(f"`{name}`")
        return column.isNull() | (column <= F.lit(high).cast(kind))

    def _file_ranges(self, version: int) -> list[FileRange] | None:
        """The data files' statistics, read at most every _RANGES_REFRESH versions: a stale
        list only makes a bound looser, or (rows deleted since) the chunk short, which
        ``chunk`` notices."""
        if self._ranges is not None and version - self._ranges[0] < _RANGES_REFRESH:
            return self._ranges[1]
        if self._ranges_unavailable:
            return None
        try:
            ranges = self._read_file_ranges(version)
        except Exception as error:  # noqa: BLE001 - only an optimisation: chunks are read unbounded
            self._ranges_unavailable = True
            log.warning("backfill: the statistics of the table at %s could not be read (%s); each chunk reads every "
                        "row after the position", self._table.location.root, str(error).splitlines()[0])
            return None
        self._ranges = (version, ranges)
        return ranges

    def _read_file_ranges(self, version: int) -> list[FileRange]:
        # Delta has no public API for its files' statistics: its snapshot's withStats, in
        # the pinned Delta (tools/jars/pom.xml), read through the JVM. getSnapshotAt's
        # defaults are Scala's, which Py4J cannot fill in.
        jvm = self._spark.sparkContext._jvm
        assert jvm is not None
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self._spark._jsparkSession, self._uri)
        defaults = [getattr(delta_log, f"getSnapshotAt$default${n}")() for n in (2, 3, 4)]
        files = DataFrame(delta_log.getSnapshotAt(version, *defaults).withStats(), self._spark)
        name = self._key_types[0][0]
        found = files.select(F.col("stats.numRecords"), F.col(f"stats.minValues.`{name}`"),
                             F.col(f"stats.maxValues.`{name}`")).collect()
        return [FileRange(rows or 0, low if rows is not None else None, high) for rows, low, high in found]

    def read_aside(self) -> None:
        """Runs the calling thread's Spark jobs in a scheduler pool of their own, which the
        fair scheduler shares with the driver's other jobs task by task: a long chunk read
        then delays a plan of changes or a reader's batch by a task, not by the whole read
        (with one queue, they waited for it)."""
        self._spark.sparkContext.setLocalProperty("spark.scheduler.pool", READ_ASIDE_POOL)

    def count(self, version: int, position: Position) -> int:
        with self._reading({"versionAsOf": str(version)}) as rows:
            return rows.where(self._after(position)).count() if position.key is not None else rows.count()

    def concat(self, parts: Sequence[pa.Table]) -> pa.Table:
        return pa.concat_tables([self._empty(), *parts])

    @contextmanager
    def _reading(self, options: Mapping[str, str]) -> Iterator[DataFrame]:
        """The table read with ``options``; errors of the load and of the Spark jobs run on it
        meanwhile translated when they say that versions or files it needs are gone (a data
        file compacted under a chunk being read surfaced as a raw Py4JJavaError, exit 1,
        where the load's own errors said which versions)."""
        try:
            yield self._spark.read.format("delta").options(**options).load(self._uri)
        except Exception as error:  # noqa: BLE001 - re-raised, translated when it says which versions are gone
            translated = _translate(error, self._table, options)
            if translated is error:
                raise
            raise translated from error

    def _up_to(self, position: Position, negate: bool = False) -> Column | None:
        """Keys at or before ``position`` (after it, negated) as a condition; None where no key is."""
        if not position.started or position.finished:
            return F.lit(True) if negate != position.finished else None
        after = self._after(position)
        return after if negate else ~after

    def _after(self, position: Position) -> Column:
        """Rows whose key sorts after the position, as ``orderBy`` sorts (nulls first).
        Written as plain comparisons of each column with a literal, lexicographically, so
        that Delta skips the files whose statistics put them wholly before the position."""
        assert position.key is not None
        values = json.loads(position.key)
        after = F.lit(False)
        equal_so_far = F.lit(True)
        for name, kind in self._key_types:
            column, value = F.col(f"`{name}`"), values.get(name)
            if value is None:
                greater, equal = column.isNotNull(), column.isNull()
            else:
                # A null key sorts first: it is neither after nor equal to a value (and the
                # test must never be null, or "not after" would drop the row too).
                literal = _literal(value, kind)
                greater, equal = column.isNotNull() & (column > literal), column.eqNullSafe(literal)
            after = after | (equal_so_far & greater)
            equal_so_far = equal_so_far & equal
        return after

    def _arrow(self, df: DataFrame) -> pa.Table:
        return self._conform(df.toArrow())

    def _conform(self, table: pa.Table) -> pa.Table:
        return table.select(self._arrow_schema.names).cast(self._arrow_schema)

    def _empty(self) -> pa.Table:
        return self._arrow_schema.empty_table()


def _and(left: Column | None, right: Column | None) -> Column | None:
    return None if left is None or right is None else left & right


def _or(left: Column | None, right: Column | None) -> Column | None:
    return right if left is None else left if right is None else left | right


def _literal(value: Any, kind: DataType) -> Column:
    """A key's value as Spark's to_json wrote it, back as a literal of its type."""
    if isinstance(kind, BinaryType):
        return F.unbase64(F.lit(value))
    return F.lit(value).cast(kind)


def _translate(error: Exception, table: DeltaTableRef, options: Mapping[str, str]) -> Exception:
    text = str(error)
    if "VersionNotFound" in text or "DELTA_VERSION_NOT_FOUND" in text or "DELTA_CHANGE_DATA_FILE_NOT_FOUND" in text \
            or "FileNotFoundException" in text or "DELTA_MISSING_CHANGE_DATA" in text or "FILE_NOT_EXIST" in text:
        return BackfillError(f"versions of the table at {table.location.root} that this reader still needs "
                             f"({dict(options)}) are gone (vacuumed or cleaned up): {text.splitlines()[0]}")
    return error


# ---- the planner --------------------------------------------------------------------------------


class Planner:
    """Writes the plans of one backfilled source, a thread of the driver."""

    def __init__(self, persistent_id: str, view: DeltaTableView, store: PlanStore, settings: BackfillSettings,
                 committed: Callable[[], int], poll_s: float = 1.0,
                 live_rate: Callable[[], LiveRate | None] = lambda: None) -> None:
        self.persistent_id = persistent_id
        self._view = view
        self._store = store
        self._settings = settings
        self._committed = committed
        self._poll_s = poll_s
        self._live_rate = live_rate
        """The rate set while the driver runs (by the operator), if one was set."""
        # Up to two chunks of allowance: a read slower than the limit (a new version's
        # changes, files spanning the key range) is made up by the next ones, so the limit
        # holds on average wherever the planner can go faster than it (one chunk lost the
        # excess at 0.75 of the unthrottled rate). At a low limit, SAVED_ALLOWANCE_S of it.
        self._bucket = TokenBucket(settings.rows_per_second, least=settings.chunk_rows,
                                   most=2 * settings.chunk_rows, saved_s=SAVED_ALLOWANCE_S)
        self._meter = RateMeter()
        self._frontier: Frontier | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._ahead: _Ahead | None = None
        """A chunk being read, or read and not yet handed over."""
        self._in_line = False
        """The next chunk is read within its plan, as the first one is: set once a chunk read
        ahead could not be handed over, so that a table compacted faster than chunks are
        read ahead still makes progress."""
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self, on_error: Callable[[BaseException], None]) -> None:
        def run() -> None:
            try:
                self._run()
            except BaseException as error:  # noqa: BLE001 - handed to the driver, which stops
                self.error = error
                on_error(error)

        self._thread = threading.Thread(target=run, name=f"spark_app-backfill-{self.persistent_id}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def progress(self) -> Progress | None:
        """None until the first plan has measured the table: a start has no size or version yet."""
        frontier = self._frontier
        if frontier is None or frontier.version is None:
            return None
        return progress(frontier, self._meter.rate(), self._bucket.rate == 0)

    def _run(self) -> None:
        frontier = self._frontier = self._store.frontier()
        log.info("backfill %s: %s at plan %d, version %s: %s", self.persistent_id,
                 "resuming" if frontier.plans else "starting", frontier.plans, frontier.version, _describe(frontier))
        while not self._stop.is_set():
            self._apply_live_rate()
            done = self._committed()
            self._store.drop_before(min(done, frontier.plans))  # the newest plan stays: it holds the frontier
            if frontier.plans - done >= self._settings.lookahead:
                self._sleep(0.2)
                continue
            step = self._step(frontier)
            if step is None:
                continue
            plan, reserved = step
            if plan is None:
                self._bucket.refund(reserved)
                self._sleep(self._poll_s)
                continue
            if not self._store.create(plan.rows, plan.frontier):
                self._bucket.refund(reserved)
                log.warning("backfill %s: plan %d was written by another driver; carrying on from it",
                            self.persistent_id, plan.frontier.plans)
                frontier = self._frontier = self._store.frontier()
                continue
            self._bucket.refund(reserved - plan.chunk)
            if plan.chunk:
                self._meter.add(plan.chunk)
            log.info("backfill %s: plan %d at version %d: %d changes, %d rows read (%s)", self.persistent_id,
                     plan.frontier.plans, plan.frontier.version, plan.changes, plan.chunk, _describe(plan.frontier))
            if plan.frontier.finished and not frontier.finished:
                log.info("backfill %s: finished, %d rows read; following changes only",
                         self.persistent_id, plan.frontier.rows_read)
            frontier = self._frontier = plan.frontier
            self._sleep(self._poll_s if self._ahead is not None else self._pause_after(frontier))

    def _step(self, frontier: Frontier) -> tuple[Plan[pa.Table] | None, int] | None:
        """The next plan (None: nothing to hand over) and the rows reserved for its chunk;
        None when a chunk read ahead began or was set aside instead."""
        ahead = self._ahead
        if ahead is not None and not ahead.done():
            # While a chunk is read, changes to the keys already read go on in plans of
            # their own: a live change waits for a plan of changes, not for the chunk.
            return next_plan(frontier, self._view, 0), 0
        self._ahead = None
        if ahead is not None:
            read = self._take(ahead, frontier)
            if read is None:
                self._in_line = True
                return None
            try:
                return next_plan(frontier, self._view, read.limit, ahead=read), read.limit
            except BackfillError as error:
                # The changes since it was read are gone: compacted once the plans of changes
                # moved the reader's hold past its version.
                log.warning("backfill %s: a chunk read at version %d cannot be handed over, reading it "
                            "again: %s", self.persistent_id, read.version, error)
                self._bucket.refund(read.limit)
                self._in_line = True
                return None
        reserved = self._bucket.reserve(self._settings.chunk_rows)
        if reserved and frontier.version is not None and not frontier.finished and not self._in_line:
            self._ahead = _Ahead(self._view, frontier, reserved, self._wake, self.persistent_id)
            return None
        plan = next_plan(frontier, self._view, reserved)
        if plan is not None and plan.chunk:
            self._in_line = False
        return plan, reserved

    def _take(self, ahead: _Ahead, frontier: Frontier) -> ReadAhead[pa.Table] | None:
        """The chunk read ahead, or None (its rows given back to the bucket) when it can no
        longer be handed over: read from another position (another driver's plans were
        taken over), or its version gone before it was read."""
        try:
            read = ahead.result()
        except BackfillError as error:
            log.warning("backfill %s: a chunk read at version %d failed, reading it again: %s",
                        self.persistent_id, ahead.version, error)
            self._bucket.refund(ahead.limit)
            return None
        if not read.fits(frontier):
            self._bucket.refund(ahead.limit)
            return None
        return read

    def _sleep(self, seconds: float) -> None:
        """Waits ``seconds``, or less if a chunk read ahead ends or the planner is stopped."""
        self._wake.wait(seconds)
        self._wake.clear()

    def _pause_after(self, frontier: Frontier) -> float:
        """How long to wait before the next plan. Unthrottled: not at all. Rate-limited:
        until a poll's worth of rows is allowed, so that a chunk is read every poll or as
        soon as the last read ends. (A whole poll after every plan made each cycle the
        read's time plus the poll: the chunk the next cycle was owed outgrew the bucket's
        one chunk, and the excess was lost.) Paused or finished: a poll, for changes."""
        rate = self._bucket.rate
        if frontier.finished or rate == 0:
            return self._poll_s
        if rate is None:
            return 0.0
        wait = self._bucket.seconds_until(max(1, min(self._settings.chunk_rows, int(rate * self._poll_s))))
        return self._poll_s if wait is None else min(self._poll_s, wait)

    def _apply_live_rate(self) -> None:
        live = self._live_rate()
        if live is not None and live.rows_per_second != self._bucket.rate:
            log.info("backfill %s: rate limit changed from %s to %s rows/s", self.persistent_id,
                     _rate(self._bucket.rate), _rate(live.rows_per_second))
            self._bucket.set_rate(live.rows_per_second)


class _Ahead:
    """A chunk read in a thread of its own, at the frontier's version and position, while
    the planner writes plans of changes. Its Spark jobs run in a scheduler pool of their
    own (DeltaTableView.read_aside), so they do not hold up the plans of changes."""

    def __init__(self, view: DeltaTableView, frontier: Frontier, limit: int, wake: threading.Event,
                 persistent_id: str) -> None:
        assert frontier.version is not None
        self.version, self.after, self.limit = frontier.version, frontier.position, limit
        self._view = view
        self._wake = wake
        self._chunk: Chunk[pa.Table] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, name=f"spark_app-backfill-{persistent_id}-chunk",
                                        daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            self._view.read_aside()
            self._chunk = self._view.chunk(self.version, self.after, self.limit)
        except BaseException as error:  # noqa: BLE001 - raised in the planner's thread by result()
            self._error = error
        finally:
            self._wake.set()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> ReadAhead[pa.Table]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._chunk is not None
        return ReadAhead(self.version, self.after, self.limit, self._chunk)


@dataclass(frozen=True)
class LiveRate:
    """A rate limit set while the driver runs; None is unlimited, 0 pauses."""

    rows_per_second: float | None


def _rate(rate: float | None) -> str:
    return "unlimited" if rate is None else f"{rate:g}"


def _describe(frontier: Frontier) -> str:
    if frontier.version is None:
        return "nothing read yet"
    if frontier.finished:
        return f"backfill done ({frontier.rows_read} rows), following changes"
    return f"{frontier.rows_read} rows read, {frontier.remaining} left"


# ---- the reader's source --------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanPartition:
    """One stored plan, as a task reads it (spark_app.runtime.sources.planned)."""

    state: Backend
    persistent_id: str
    number: int
    arrow_schema: pa.Schema
    retry: RetryPolicy

    def read(self) -> Iterator[pa.RecordBatch]:
        try:
            table = PlanStore(self.state.storage(self.retry), self.persistent_id).read(self.number)
        except NotFound:
            raise BackfillError(f"plan {self.number} of source {self.persistent_id} is gone from the "
                                "state; it is removed only once committed, so the state was changed by hand") from None
        yield from table.select(self.arrow_schema.names).cast(self.arrow_schema).to_batches()


class PlanStreamReader(CountingReader):
    """The plans of one source, in order; the offset is how many have been read."""

    unit = "plans"

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        super().__init__(options)
        self._per_trigger = max(1, int(options.get("max_plans_per_trigger", "1")))
        self._arrow_schema = to_arrow_schema(schema)

    @cached_property
    def _store(self) -> PlanStore:
        return PlanStore(self._snapshot.storage(self._retry), self._pid)

    def latestOffset(self) -> dict[str, Any]:
        return self.offset(min(self._store.newest(), self.planned + self._per_trigger))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[PlanPartition]:
        first, last = self.plan_range(start, end)
        return [PlanPartition(self._snapshot, self._pid, n, self._arrow_schema, self._retry)
                for n in range(first + 1, last + 1)]


class PlanTracker:
    """A backfilled source in a query's commits."""

    def __init__(self, snapshots: Storage, persistent_id: str, table: DeltaTableRef) -> None:
        self._store = PlanStore(snapshots, persistent_id)
        self._table = table

    def caught_up(self, committed: Offset | None) -> bool:
        if _plans(committed) < self._store.newest():
            return False
        frontier = self._store.frontier()
        return frontier.finished and frontier.version == self._table.latest_version()

    def unreadable(self, start: Offset | None, end: Offset) -> dict[str, int]:
        return {}  # the stored plans say what to read; a table rewound under them raises TableRewound

    def counters(self, previous: Mapping[str, int], start: Offset | None, end: Offset) -> dict[str, int]:
        return {"plans": _plans(end)}

    def describe(self, offset: Offset) -> str:
        return f"{_plans(offset)} plans"


def _plans(offset: Offset | None) -> int:
    return int(offset.get("plans", 0)) if offset else 0
