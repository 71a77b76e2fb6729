"""The fixed-point loop over Spark DataFrames, and the step's fingerprint.

Tables are sets: every iterated table is made distinct after each step. Each iteration's
result is locally checkpointed, so the plan does not grow with the iteration count.

A step may take an optional ``delta`` argument (semi-naive evaluation): it is then told
which rows of the iterated tables changed in the previous iteration and which input rows
were inserted since the stored fixed point, and may restrict its work to them. It must
still return the complete next tables.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

log = logging.getLogger("spark_app.iterate")

Step = Callable[..., Mapping[str, DataFrame]]


@dataclass(frozen=True)
class Delta:
    """What a semi-naive step may restrict its work to."""

    changed: Mapping[str, DataFrame]
    """Per iterated table: the rows that are new since the previous iteration. On the first
    iteration: every row of a cold start, the rows added to the stored fixed point of a
    warm one."""
    inserted: Mapping[str, DataFrame]
    """Per input table: the rows inserted since the stored fixed point (on the first
    iteration only; empty afterwards). On a cold start: every row."""
    first: bool


@dataclass(frozen=True)
class Convergence:
    """When two successive iterations count as the same."""

    tolerance: float | None = None
    """None: exactly equal. Otherwise rows are matched by ``key`` and equal when every
    other numeric column moved by at most ``tolerance``."""
    key: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    tables: dict[str, DataFrame]
    iterations: int
    converged: bool
    seconds: float


def run_fixed_point(
    step: Step,
    start: Mapping[str, DataFrame],
    inputs: Mapping[str, DataFrame],
    inserted: Mapping[str, DataFrame],
    changed_first: Mapping[str, DataFrame],
    limit: int | None,
    convergence: Convergence,
    cold: bool,
    progress: Callable[[int], None] = lambda _: None,
) -> Outcome:
    began = time.monotonic()
    wants_delta = "delta" in inspect.signature(step).parameters
    current = {name: _materialize(df.distinct()) for name, df in start.items()}
    sizes = {name: df.count() for name, df in current.items()}
    changed: Mapping[str, DataFrame] = changed_first
    iteration = 0
    while limit is None or iteration < limit:
        iteration += 1
        arguments: dict[str, Any] = {**inputs, **current}
        if wants_delta:
            first_inserted = inserted if iteration == 1 else {k: v.limit(0) for k, v in inserted.items()}
            arguments["delta"] = Delta(changed=changed, inserted=first_inserted, first=iteration == 1 and cold)
        produced = step(**arguments)
        _check_tables(produced, current)
        following = {name: _materialize(produced[name].select(*current[name].columns).distinct())
                     for name in current}
        progress(iteration)
        # Computed once, for the next step's delta and for the exact convergence test.
        added = {name: _materialize(following[name].subtract(current[name])) for name in current}
        following_sizes = {name: df.count() for name, df in following.items()}
        done = _same(current, following, added, sizes, following_sizes, convergence)
        for df in [*current.values(), *(changed.values() if iteration > 1 else ())]:
            df.unpersist()
        current, sizes, changed = following, following_sizes, added
        if done:
            return Outcome(current, iteration, True, time.monotonic() - began)
    return Outcome(current, iteration, False, time.monotonic() - began)


def fingerprint(step: Step, parameters: Mapping[str, Any], schemas: Mapping[str, str]) -> str:
    """A hash of the step's code, the declared parameters and the tables' schemas.

    The code is the step's source when Python can find it, else its bytecode and
    constants. Functions the step calls are not followed: bump ``version`` when they
    change in a way that should invalidate stored results.
    """
    try:
        code = inspect.getsource(step)
    except (OSError, TypeError):
        code_object = getattr(step, "__code__", None)
        code = repr((code_object.co_code, code_object.co_consts, code_object.co_names)) if code_object else repr(step)
    digest = hashlib.sha256()
    for part in (code, repr(sorted(parameters.items())), repr(sorted(schemas.items()))):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def _materialize(df: DataFrame) -> DataFrame:
    return df.localCheckpoint(eager=True)


def _check_tables(produced: Any, current: Mapping[str, DataFrame]) -> None:
    if not isinstance(produced, Mapping):
        raise TypeError(f"an iterate step must return a dict of DataFrames, got {type(produced).__name__}")
    missing = set(current) - set(produced)
    if missing:
        raise ValueError(f"the iterate step did not return the iterated tables {sorted(missing)}")


def _same(before: Mapping[str, DataFrame], after: Mapping[str, DataFrame], added: Mapping[str, DataFrame],
          before_sizes: Mapping[str, int], after_sizes: Mapping[str, int], convergence: Convergence) -> bool:
    """Whether two successive iterations count as the same. Exactly: the tables are sets, so
    equal sizes and nothing added means equal."""
    for name in before:
        if convergence.tolerance is None or name not in convergence.key:
            if before_sizes[name] != after_sizes[name] or not added[name].isEmpty():
                return False
        elif max_change(before[name], after[name], convergence.key[name]) > convergence.tolerance:
            return False
    return True


def max_change(before: DataFrame, after: DataFrame, key: tuple[str, ...]) -> float:
    """The largest absolute change of a numeric value between rows with equal keys; a row
    present on one side only counts as an infinite change."""
    values = [f.name for f in after.schema.fields if f.name not in key and f.dataType.typeName() in _NUMERIC]
    joined = before.alias("b").join(after.alias("a"), on=list(key), how="full_outer")
    missing = F.lit(float("inf"))
    deltas = [
        F.when(F.col(f"b.{v}").isNull() | F.col(f"a.{v}").isNull(), missing)
        .otherwise(F.abs(F.col(f"a.{v}") - F.col(f"b.{v}")))
        for v in values
    ]
    if not deltas:
        return 0.0
    row = joined.select(F.max(F.greatest(*deltas) if len(deltas) > 1 else deltas[0]).alias("m")).first()
    return float(row["m"]) if row and row["m"] is not None else 0.0


_NUMERIC = {"double", "float", "integer", "long", "short", "byte", "decimal"}
