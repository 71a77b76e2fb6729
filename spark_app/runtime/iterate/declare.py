"""Turning ``spark_app.iterate(...)`` into an iterate sink and the streaming query feeding it."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_app.runtime.iterate.engine import Convergence, Delta, Step, fingerprint
from spark_app.runtime.iterate.node import ROW, TABLE, IterateSink, IterateSpec
from spark_app.runtime.iterate.policy import Kind
from spark_app.runtime.iterate.store import DIFF
from spark_app.runtime.pipeline import Pipeline, PipelineError, QuerySpec, source_ids
from spark_app.runtime.plan import PlanFacts
from spark_app.runtime.sinks.base import Output

CHANGE_COLUMN = "diff"


@dataclass(frozen=True)
class IterateTable:
    """An iterated table's result, as outputs take it (a ``FeedsOutputs`` of the pipeline)."""

    sink: IterateSink
    table: str
    columns: tuple[str, ...] | None = None

    def select(self, *columns: str) -> IterateTable:
        """Only these columns of the result reach the output; a change in the others (such
        as bookkeeping the step keeps for itself) emits nothing."""
        return IterateTable(self.sink, self.table, tuple(columns))

    def attach(self, output: Output) -> None:
        self.sink.attach(self.table, output, self.columns)

    def describe(self) -> str:
        return "an iterate result"


class IterateResult:
    """The iterated tables' results, by name: ``result.labels`` or ``result["labels"]``.
    Outputs take them like DataFrames: ``sa.io.jsonlines.write(result.labels, path)``."""

    def __init__(self, tables: Mapping[str, IterateTable]) -> None:
        self._tables = dict(tables)

    def __getattr__(self, name: str) -> IterateTable:
        try:
            return self._tables[name]
        except KeyError:
            raise AttributeError(f"the iterate has no iterated table {name!r}; it has {sorted(self._tables)}") from None

    def __getitem__(self, name: str) -> IterateTable:
        return self._tables[name]


def declare(
    pipeline: Pipeline,
    step: Step,
    persistent_id: str,
    limit: int | None,
    monotone: bool,
    tolerance: float | None,
    key: Mapping[str, list[str]] | None,
    invalidate: Callable[..., Mapping[str, DataFrame]] | None,
    version: str,
    tables: Mapping[str, DataFrame],
) -> IterateResult:
    if not tables:
        raise PipelineError(f"iterate {persistent_id!r} has no tables: pass them as keyword arguments")
    if monotone and tolerance is not None:
        raise PipelineError(f"iterate {persistent_id!r}: a step is declared monotone or a contraction, not both")
    if invalidate is not None and not monotone:
        raise PipelineError(f"iterate {persistent_id!r}: invalidate is for monotone steps (delete and rederive)")
    if limit is not None and limit < 1:
        raise PipelineError(f"iterate {persistent_id!r}: limit must be at least 1, got {limit}")
    schemas = {name: _contents_schema(df) for name, df in tables.items()}
    iterated = _iterated_tables(step, persistent_id, schemas, pipeline)
    keys = {name: tuple(columns) for name, columns in (key or {}).items()}
    if tolerance is not None and set(keys) != set(iterated):
        raise PipelineError(f"iterate {persistent_id!r}: a contraction needs key={{table: [columns]}} for each "
                            f"iterated table {list(iterated)}, to match rows between iterations")
    kind = Kind.MONOTONE if monotone else Kind.CONTRACTION if tolerance is not None else Kind.GENERAL
    parameters: dict[str, Any] = {"kind": kind.value, "limit": limit, "tolerance": tolerance,
                                  "key": sorted(keys.items()), "version": version}
    spec = IterateSpec(
        persistent_id=persistent_id,
        step=step,
        tables={name: _without_change(df) if not df.isStreaming else df for name, df in tables.items()},
        iterated=iterated,
        schemas={**schemas, **{f"result:{name}": schemas[name] for name in iterated}},
        kind=kind,
        limit=limit,
        convergence=Convergence(tolerance, keys),
        invalidate=invalidate,
        fingerprint=fingerprint(step, parameters, {n: s.simpleString() for n, s in schemas.items()}),
        streaming=tuple(name for name, df in tables.items() if df.isStreaming),
    )
    streams = [_tagged(name, df, schemas[name]) for name, df in tables.items() if df.isStreaming]
    union = None
    for stream in streams:
        union = stream if union is None else union.unionByName(stream)
    sink = IterateSink(spec, pipeline.spark())
    sources = source_ids(union) if union is not None else ()
    signature = (f"Iterate({spec.persistent_id})",)
    pipeline.add_query(spec.persistent_id, QuerySpec(sink, union, PlanFacts(signature, None), sources))
    return IterateResult({name: IterateTable(sink, name) for name in iterated})


def _contents_schema(df: DataFrame) -> StructType:
    """The table's rows without the change column: a ``diff`` column says +1 insert, -1 delete."""
    return StructType([f for f in df.schema.fields if f.name != CHANGE_COLUMN])


def _without_change(df: DataFrame) -> DataFrame:
    return df.drop(CHANGE_COLUMN) if CHANGE_COLUMN in df.columns else df


def _tagged(name: str, df: DataFrame, schema: StructType) -> DataFrame:
    change = F.col(CHANGE_COLUMN).cast("int") if CHANGE_COLUMN in df.columns else F.lit(1)
    return df.select(F.lit(name).alias(TABLE), F.to_json(F.struct(*[F.col(f.name) for f in schema.fields])).alias(ROW),
                     change.alias(DIFF))


def _iterated_tables(step: Step, persistent_id: str, schemas: Mapping[str, StructType],
                     pipeline: Pipeline) -> tuple[str, ...]:
    """Which tables the step iterates: the names of the tables it returns, found by applying
    it to empty tables (Spark plans lazily, so nothing runs)."""
    spark = pipeline.spark()
    empty = {name: spark.createDataFrame([], schema) for name, schema in schemas.items()}
    arguments: dict[str, Any] = dict(empty)
    if "delta" in inspect.signature(step).parameters:
        arguments["delta"] = Delta(changed=empty, inserted=empty, first=True)
    try:
        produced = step(**arguments)
    except Exception as error:
        raise PipelineError(f"iterate {persistent_id!r}: applying the step to empty tables failed: {error}") from error
    if not isinstance(produced, Mapping) or not produced:
        raise PipelineError(f"iterate {persistent_id!r}: the step must return a non-empty dict of DataFrames")
    unknown = set(produced) - set(schemas)
    if unknown:
        raise PipelineError(f"iterate {persistent_id!r}: the step returns {sorted(unknown)}, which are not among "
                            f"the tables passed ({sorted(schemas)}); pass their initial contents too")
    for name, df in produced.items():
        if sorted(df.columns) != sorted(schemas[name].fieldNames()):
            raise PipelineError(f"iterate {persistent_id!r}: the step turns table {name!r} with columns "
                                f"{schemas[name].fieldNames()} into one with columns {df.columns}")
    return tuple(name for name in schemas if name in produced)
