"""The pipeline being declared: its sources and outputs, and the SparkSession they use.

User code declares sources and outputs through ``spark_app.io`` and then calls
``spark_app.run``; like a dataflow graph, the declarations collect in the current
``Pipeline``. The SparkSession is created on first use, from the environment the
operator injected when there is one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from spark_app import contract
from spark_app.persistence import Backend
from spark_app.runtime import scratch
from spark_app.runtime.jvm.conf import initial_conf
from spark_app.runtime.jvm.json_messages import parse_in_jvm
from spark_app.runtime.jvm.map_in_arrow import map_in_arrow
from spark_app.runtime.jvm.session import build_session, reach_bucket
from spark_app.runtime.plan import PlanFacts, analyze
from spark_app.runtime.sinks.base import RESERVED_COLUMNS, Output, SingleSink, Sink
from spark_app.runtime.sinks.delta import DeltaOutput
from spark_app.runtime.sinks.jsonlines import JsonLinesOutput
from spark_app.runtime.sinks.kafka import KafkaOutput
from spark_app.runtime.sources.base import Tracker
from spark_app.runtime.sources.delta_table import (
    BackfillError,
    BackfillSettings,
    DeltaTableRef,
    PlanStreamReader,
    PlanTracker,
    changelog_schema,
    describe_table,
    table_metadata,
)
from spark_app.runtime.sources.files import FileStreamReader, FileTracker, input_option
from spark_app.runtime.sources.kafka import (
    KafkaSourceSpec,
    KafkaTracker,
    MessagePlan,
    ParseMessages,
    PendingLetters,
)
from spark_app.runtime.sources.planned import planned_stream
from spark_app.runtime.tables.changelog import DIFF, ChangelogSource, ChangelogTracker
from spark_app.runtime.tables.location import TableLocation
from spark_app.runtime.tables.lookup import lookups_in
from spark_app.runtime.tables.publish import PublishOptions, TableOutput
from spark_app.runtime.tables.readers import TableInput
from spark_app.state.delta_log import TableLog
from spark_app.state.identity import Manifest, QueryIdentity, SourceIdentity
from spark_app.state.tables import (
    BACKFILL,
    BACKFILL_FORMAT,
    CHANGELOG,
    KEY_PROPERTY,
    LOOKUP,
    TABLES,
    TableError,
    TableRef,
    check_table_name,
    decode_key,
)
from spark_app.storage import Storage

log = logging.getLogger("spark_app")

# Our file sources print their options as persistent_id=..., Delta's streaming source (a
# shared table's changelog) as spark_app_persistent_id -> ...
_RELATION_PID = re.compile(r"persistent_id(?:=| -> )([A-Za-z0-9_.\-]+)")


class PipelineError(Exception):
    """The pipeline's declarations are inconsistent; the message says how to fix them."""


@dataclass(frozen=True)
class SourceSpec:
    persistent_id: str
    format: str
    location: str
    """What it reads (a folder, an S3 prefix, Kafka topics), for the state's identity."""
    schema: str
    generated_id: bool


@dataclass(frozen=True)
class TableSource:
    table: DeltaTableRef
    settings: BackfillSettings
    schema: StructType
    """The table's columns (the source's are these and diff)."""


@dataclass
class QuerySpec:
    """One Spark streaming query: its DataFrame and the sink its batches go to. An iterate
    operator over static tables only has no DataFrame: it runs once at start-up."""

    sink: Sink
    df: DataFrame | None
    facts: PlanFacts
    sources: tuple[str, ...] = field(default_factory=tuple)
    """The persistent ids of its streaming sources, in the order of Spark's offset log."""
    tables: tuple[str, ...] = field(default_factory=tuple)
    """The persistent ids of the shared tables it reads (changelogs and lookups)."""
    lookups: tuple[str, ...] = field(default_factory=tuple)


class Pipeline:
    def __init__(self, environment: contract.DriverEnvironment) -> None:
        self.environment = environment
        """The driver's environment, parsed once (spark_app.contract)."""
        self.sources: dict[str, SourceSpec] = {}
        self.kafka: dict[str, KafkaSourceSpec] = {}
        """The Kafka sources by persistent id (connections with their credentials)."""
        self.kafka_letters: dict[str, PendingLetters] = {}
        """What the JVM's parse of each JSON Kafka source set aside, for the commits to write."""
        self.queries: dict[str, QuerySpec] = {}
        self.tables: dict[str, TableSource] = {}
        """The sources that read a Delta table (by persistent id), backfilled by a planner."""
        self.shared: dict[str, TableInput] = {}
        """The shared tables it reads, by persistent id."""
        self._spark: SparkSession | None = None
        self._context_dir = scratch.process_folder("context")
        self.context_path = os.path.join(self._context_dir, "context.json")
        self._generated = 0

    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = build_session(initial_conf(self.environment), self.environment.spark_log_level)
        return self._spark

    def add_source(self, fmt: str, path: str, schema: str, persistent_id: str | None,
                   options: dict[str, str]) -> DataFrame:
        spark = self.spark()
        generated = persistent_id is None
        persistent_id = self._source_id(fmt, path, persistent_id)
        backend = Backend.from_uri(path, options=self.environment.s3)
        struct = _ddl_schema(spark, schema, f"the {fmt} source {persistent_id!r}")
        reader_options = {"persistent_id": persistent_id, "format": fmt, "input": input_option(backend),
                          "context": self.context_path,
                          "parallelism": str(spark.sparkContext.defaultParallelism), **options}
        df = planned_stream(spark, lambda: FileStreamReader(reader_options, struct), struct,
                            {"persistent_id": persistent_id})
        self.sources[persistent_id] = SourceSpec(persistent_id, fmt, backend.root, df.schema.simpleString(), generated)
        return df

    def add_kafka_source(self, spec: KafkaSourceSpec) -> DataFrame:
        """Spark's Kafka source, its values parsed in tasks: JSON in the JVM, CSV in Python
        workers (spark_app.runtime.sources.kafka)."""
        spark = self.spark()
        self._source_id("kafka", spec.location, spec.persistent_id)
        raw = spark.readStream.format("kafka").options(**spec.reader_options()).load()
        value = StructType() if spec.value_format == "raw" else _ddl_schema(spark, spec.schema or "")
        clash = [c for c in spec.columns if c in value.fieldNames()]
        if clash:
            raise PipelineError(f"Kafka source {spec.persistent_id!r}: columns {clash} are both in the value's "
                                "schema and among the record's columns; rename the schema's fields or drop them "
                                "from columns=")
        plan = MessagePlan(spec.persistent_id, spec.value_format, to_arrow_schema(value), spec.columns, spec.csv)
        if spec.value_format == "raw":
            df = raw.select("value", *spec.columns)
        elif spec.value_format == "json":
            df, drain = parse_in_jvm(raw, value, spec.columns, spec.persistent_id)
            self.kafka_letters[spec.persistent_id] = PendingLetters(plan, value.simpleString(), drain)
        else:
            output = StructType(list(value.fields) + [raw.schema[c] for c in spec.columns])
            df = map_in_arrow(raw, ParseMessages(plan), output)
        self.sources[spec.persistent_id] = SourceSpec(spec.persistent_id, f"kafka/{spec.value_format}", spec.location,
                                                      value.simpleString(), False)
        self.kafka[spec.persistent_id] = spec
        return df

    def add_table_changelog(self, table: str, persistent_id: str, location: str | None,
                            max_files_per_trigger: int | None, with_version: bool,
                            backfill: BackfillSettings | None = None) -> DataFrame:
        """A shared table's changes, as a stream with ``diff`` (spark_app.io.tables.read):
        Delta's own change data feed, or with ``backfill`` the keyed backfill's plans."""
        where = self._table_input(table, persistent_id, location, BACKFILL if backfill else CHANGELOG)
        schema = self._table_schema(where)
        if DIFF in schema.fieldNames():
            raise PipelineError(f"table {where.ref} has a column named {DIFF!r}, which its changelog adds; "
                                "rename it in the publisher")
        if backfill is not None:
            return self._table_backfill(where, persistent_id, backfill)
        df = ChangelogSource(self.spark(), where.uri, persistent_id, max_files_per_trigger=max_files_per_trigger,
                             with_version=with_version).stream()
        self.sources[persistent_id] = SourceSpec(persistent_id, "table", where.folder.root, df.schema.simpleString(), False)
        self.shared[persistent_id] = TableInput(persistent_id, CHANGELOG, where)
        return df

    def _table_backfill(self, where: TableLocation, persistent_id: str, settings: BackfillSettings) -> DataFrame:
        """A shared table read as a keyed Delta table is (add_table_source), by the key its
        publisher recorded, and held like a changelog (spark_app.runtime.tables.readers)."""
        spark = self.spark()
        try:
            key = decode_key(table_metadata(spark, where.uri)[1].get(KEY_PROPERTY), str(where.ref))
            ref = DeltaTableRef(where.folder, key, where.keys)
            schema = describe_table(spark, ref)
        except (TableError, BackfillError) as error:
            raise PipelineError(f"source {persistent_id!r}: {error}") from None
        df = self._plans_stream(persistent_id, schema, settings)
        self.sources[persistent_id] = SourceSpec(persistent_id, BACKFILL_FORMAT, where.folder.root,
                                                 df.schema.simpleString(), False)
        self.tables[persistent_id] = TableSource(ref, settings, schema)
        self.shared[persistent_id] = TableInput(persistent_id, BACKFILL, where)
        return df

    def _plans_stream(self, persistent_id: str, schema: StructType, settings: BackfillSettings) -> DataFrame:
        struct = changelog_schema(schema)
        options = {"persistent_id": persistent_id, "context": self.context_path,
                   "max_plans_per_trigger": str(settings.max_plans_per_trigger)}
        return planned_stream(self.spark(), lambda: PlanStreamReader(options, struct), struct,
                              {"persistent_id": persistent_id})

    def add_table_lookup(self, table: str, persistent_id: str, location: str | None) -> DataFrame:
        """A shared table's latest version, as a static DataFrame read anew at each batch
        (spark_app.io.tables.lookup)."""
        where = self._table_input(table, persistent_id, location, LOOKUP)
        self._table_schema(where)
        df = self.spark().read.format("delta").load(where.uri)
        self.shared[persistent_id] = TableInput(persistent_id, LOOKUP, where)
        return df

    def _table_input(self, table: str, persistent_id: str, location: str | None, kind: str) -> TableLocation:
        if persistent_id in self.shared:
            raise PipelineError(f"persistent_id {persistent_id!r} is used by two table inputs; give each its own")
        self._source_id("table", table, persistent_id)
        namespace = self.environment.pod_namespace or (self.environment.injected.pipeline.partition("/")[0]
                                                        if self.environment.injected else "") or "local"
        try:
            ref = TableRef.parse(table, namespace)
        except TableError as error:
            raise PipelineError(str(error)) from None
        if location is not None:
            where = TableLocation(ref, Backend.from_uri(location, options=self.environment.s3)
                                  .child(f"{TABLES}/{ref.name}"))
        else:
            injected = next((i for i in self.environment.table_inputs if i.table == str(ref)), None)
            if injected is None:
                raise PipelineError(
                    f"the {kind} of table {ref} has no location: list it in the PersistentPipeline's spec.inputs "
                    "(the operator then says where it is), or, run locally, pass location= (the publisher's "
                    "state root)")
            where = TableLocation(ref, Backend.from_uri(injected.uri, options=injected.s3),
                                  self.environment.table_keys.get(injected.credentials))
        where.configure(self.spark())
        return where

    def _table_schema(self, where: TableLocation) -> Any:
        if not TableLog(where.storage).exists():
            raise PipelineError(f"table {where.ref} does not exist at {where.uri}: its publisher has not "
                                "committed a batch yet (start the publisher first)")
        return self.spark().read.format("delta").load(where.uri).schema

    def publish(self, df: DataFrame, name: str, key: list[str], options: PublishOptions) -> Output:
        """A shared table maintained from ``df`` (spark_app.io.tables.publish)."""
        try:
            check_table_name(name)
        except TableError as error:
            raise PipelineError(str(error)) from None
        if not key:
            raise PipelineError(f"table {name!r}: publish needs key=[...], the columns that identify a row")
        output = self.add_output("table", df, name, name, key, options=options)
        return output

    def add_table_source(self, path: str, key: tuple[str, ...], persistent_id: str | None,
                         settings: BackfillSettings) -> DataFrame:
        """A keyed Delta table read as a changelog: backfilled in key order, then its changes."""
        spark = self.spark()
        generated = persistent_id is None
        persistent_id = self._source_id("delta", path, persistent_id)
        table = DeltaTableRef(Backend.from_uri(path, options=self.environment.s3), key)
        # Its schema is read now, before run() configures the session for the state's storage.
        reach_bucket(spark, table.location)
        try:
            schema = describe_table(spark, table)
        except BackfillError as error:
            raise PipelineError(f"source {persistent_id!r}: {error}") from None
        df = self._plans_stream(persistent_id, schema, settings)
        self.sources[persistent_id] = SourceSpec(persistent_id, "delta", table.location.root, df.schema.simpleString(),
                                                 generated)
        self.tables[persistent_id] = TableSource(table, settings, schema)
        return df

    def _source_id(self, fmt: str, path: str, persistent_id: str | None) -> str:
        if persistent_id is None:
            self._generated += 1
            persistent_id = f"{fmt}_{self._generated}"
            warnings.warn(
                f"source {path!r} has no persistent_id, so it was named {persistent_id!r} after the order "
                "of creation; adding, removing or reordering sources will break its state. "
                "Pass persistent_id='...' to keep it stable.",
                stacklevel=4,
            )
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", persistent_id):
            raise PipelineError(f"persistent_id {persistent_id!r} may use only letters, digits, '_', '.', '-'")
        if persistent_id in self.sources:
            raise PipelineError(f"persistent_id {persistent_id!r} is used by two sources; give each its own")
        if persistent_id in self.shared:
            # A lookup is no source, and its version is committed under its id: a stream of
            # the same id would have its offsets overwritten.
            raise PipelineError(f"persistent_id {persistent_id!r} is used by a table input; give each its own")
        return persistent_id

    def add_output(self, kind: str, df: DataFrame | FeedsOutputs, path: str, name: str | None,
                   key: list[str] | None, **options: Any) -> Output:
        name = name or re.sub(r"[^A-Za-z0-9_]+", "_", os.path.basename(path.rstrip("/"))).strip("_") or kind
        if name in self._output_names():
            raise PipelineError(f"two outputs are named {name!r}; pass name='...' to tell them apart")
        if isinstance(df, FeedsOutputs):
            if kind != "jsonlines":
                raise PipelineError(f"output {name!r}: {df.describe()} can be written as JSON lines only")
            fed = JsonLinesOutput(name, path, None)
            df.attach(fed)
            return fed
        if not df.isStreaming:
            raise PipelineError(f"output {name!r} is given a static DataFrame; outputs take the "
                                "streaming DataFrames derived from spark_app sources")
        if name in self.queries:
            raise PipelineError(f"two outputs are named {name!r}; pass name='...' to tell them apart")
        facts = analyze(df)
        changes = kind == "jsonlines" and DIFF in df.columns and facts.key is None and key is None
        clash = [c for c in df.columns if c in RESERVED_COLUMNS and not (changes and c == DIFF)]
        if clash and kind in ("jsonlines", "kafka"):
            raise PipelineError(f"output {name!r} has columns {clash}, which the changelog reserves "
                                "for time and diff; rename them")
        if key is not None and (facts.key is not None or kind == "table"):
            missing = [k for k in key if k not in df.columns]
            if missing:
                raise PipelineError(f"output {name!r}: key columns {missing} are not in {df.columns}")
            if facts.key is not None:
                facts = PlanFacts(facts.stateful, tuple(key))
        output: Output
        if kind == "jsonlines":
            output = JsonLinesOutput(name, path, facts.key, changes=changes)
        elif kind == "table":
            output = TableOutput(name, key or [], df.schema, options["options"])
        elif kind == "kafka":
            output = KafkaOutput(name, path, facts.key, options.get("message_key"), options["connection"])
        else:
            output = DeltaOutput(name, path, facts.key, **options)
        lookups = lookups_in(df, {pid: t.location.uri for pid, t in self.shared.items() if t.kind == LOOKUP})
        sources = source_ids(df)
        tables = tuple(pid for pid in (*sources, *lookups) if pid in self.shared)
        self.queries[name] = QuerySpec(SingleSink(output), df, facts, sources, tables, lookups)
        return output

    def add_query(self, name: str, query: QuerySpec) -> None:
        """Registers a query that an operator of its own declares (an iterate)."""
        if name in self.queries or name in self._output_names():
            raise PipelineError(f"persistent_id {name!r} is already used; give the {query.sink.kind} its own")
        self.queries[name] = query

    def trackers(self, snapshots: Storage, dead_letter: Backend, index_compact_after: int) -> dict[str, Tracker]:
        """How each source takes part in its queries' commits."""
        trackers: dict[str, Tracker] = {}
        for pid in self.sources:
            if pid in self.tables:
                trackers[pid] = PlanTracker(snapshots, pid, self.tables[pid].table)
            elif pid in self.kafka:
                trackers[pid] = KafkaTracker(self.kafka[pid], dead_letter, pending=self.kafka_letters.get(pid))
            elif pid in self.shared:
                trackers[pid] = ChangelogTracker(self.shared[pid].location.storage)
            else:
                trackers[pid] = FileTracker(snapshots, pid, index_compact_after, dead_letter)
        return trackers

    def _output_names(self) -> set[str]:
        return {o.name for q in self.queries.values() for o in q.sink.outputs()}

    def manifest(self) -> Manifest:
        return Manifest(
            sources={pid: SourceIdentity(pid, s.format, s.schema, s.location) for pid, s in self.sources.items()},
            queries={
                name: QueryIdentity(name, q.sources, q.facts.stateful, q.facts.key)
                for name, q in self.queries.items()
            },
        )

    def write_context(self, snapshot: Backend, dead_letter: Backend, limits: Mapping[str, int],
                      outage_budget_s: float) -> None:
        with open(self.context_path + ".tmp", "w") as handle:
            json.dump({"snapshot": snapshot.to_json(), "dead_letter": dead_letter.to_json(), "limits": dict(limits),
                       "outage_budget_s": outage_budget_s}, handle)
        os.replace(self.context_path + ".tmp", self.context_path)

    def default_dead_letter(self) -> str | None:
        """Beside the first output that is a file or a folder; None if none is (Kafka
        topics; shared tables, which live in the state and have no path until they recover)."""
        outputs = [o for q in self.queries.values() for o in q.sink.outputs()]
        if not outputs:
            raise PipelineError("the pipeline has no outputs: declare one with spark_app.io.<format>.write(...)")
        files = [o for o in outputs if not isinstance(o, KafkaOutput | TableOutput)]
        return files[0].path.rstrip("/") + ".dead-letter" if files else None


def table_backfill_settings(backfill: bool, chunk_rows: int | None, rows_per_second: float | None,
                            max_plans_per_trigger: int | None, max_files_per_trigger: int | None,
                            with_version: bool) -> BackfillSettings | None:
    """The backfill a shared table's reader asks for (spark_app.io.tables.read), or None
    for Delta's own stream; an error naming the option that does not fit the other mode."""
    backfill_only = {"chunk_rows": chunk_rows, "rows_per_second": rows_per_second,
                     "max_plans_per_trigger": max_plans_per_trigger}
    if not backfill:
        given = [name for name, value in backfill_only.items() if value is not None]
        if given:
            raise PipelineError(f"{', '.join(given)} apply to a backfill: pass backfill=True as well")
        return None
    if max_files_per_trigger is not None:
        raise PipelineError("max_files_per_trigger sizes Delta's own snapshot; with backfill=True a batch takes "
                            "max_plans_per_trigger chunks of chunk_rows rows instead")
    if with_version:
        raise PipelineError("with_version is not offered with backfill=True: a chunk's rows are read as of the "
                            "table's latest version, not at the version that made each of them")
    defaults = BackfillSettings()
    try:
        return BackfillSettings(chunk_rows=defaults.chunk_rows if chunk_rows is None else chunk_rows,
                                rows_per_second=rows_per_second,
                                max_plans_per_trigger=max_plans_per_trigger or defaults.max_plans_per_trigger)
    except ValueError as error:
        raise PipelineError(str(error)) from None


@runtime_checkable
class FeedsOutputs(Protocol):
    """A table that feeds outputs by itself, with changes it computes (an iterate's result)
    rather than through a streaming query of its own."""

    def attach(self, output: Output) -> None:
        """Gives ``output`` this table's changes."""

    def describe(self) -> str:
        """What it is, for messages: "an iterate result"."""


def source_ids(df: DataFrame) -> tuple[str, ...]:
    """The persistent ids of a query's sources, in the order Spark numbers them (a
    pre-order walk of the analyzed plan, as MicroBatchExecution collects them: the order of
    its offset log's lines, which commit.offsets_by_source relies on for JVM sources)."""
    relations = (_relation_pid(n) for n in _relations(df))
    return tuple(dict.fromkeys(pid for pid in relations if pid is not None))


def _relation_pid(node: Any) -> str | None:
    found = _RELATION_PID.search(node.simpleString(500))
    if found:
        return found.group(1)
    try:  # a JVM source (Kafka) shows no options in its plan's text
        value = node.extraOptions().get("persistent_id")
    except Exception:  # noqa: BLE001 - a relation without options is not spark_app's
        return None
    return str(value) if value else None


def _ddl_schema(spark: SparkSession, ddl: str, what: str = "a Kafka source of JSON or CSV values") -> StructType:
    from pyspark.sql.types import _parse_datatype_string

    if not ddl.strip():
        raise PipelineError(f"{what} needs schema=\"field TYPE, ...\"")
    spark.sparkContext  # noqa: B018 - the parser needs the running JVM
    parsed = _parse_datatype_string(ddl)
    if not isinstance(parsed, StructType):
        raise PipelineError(f"schema {ddl!r} is not a list of fields")
    return parsed


def _relations(df: DataFrame) -> list[Any]:
    found: list[Any] = []

    def walk(node: Any) -> None:
        if node.nodeName().startswith("StreamingRelation"):
            found.append(node)
        children = node.children()
        for i in range(children.size()):
            walk(children.apply(i))

    walk(df._jdf.queryExecution().analyzed())
    return found


_current: Pipeline | None = None


def current() -> Pipeline:
    global _current
    if _current is None:
        _current = Pipeline(contract.DriverEnvironment.from_env(os.environ))
    return _current


def reset() -> None:
    """Forgets the declared sources and outputs (the SparkSession is kept)."""
    global _current
    previous = current()
    _current = Pipeline(previous.environment)
    _current._spark = previous._spark
