"""A query's first batch in a new driver runs without whole-stage code generation.

Spark writes Java source for each stage of a batch's plan and compiles it with Janino, and
the JIT then compiles the generated classes. In a JVM that has just started, that work cost
a first batch more than the generated code saved it: a small driver's first batch took
2.27 s without it against 2.70 s with it, and a first batch of a 1M-row backlog 10.1 s
against 11.8 s (bench/README.md). The query's later batches, in a JVM that has warmed up,
plan with it again.

Each query copies its session's settings when it starts (Spark's ``cloneSession``), so the
setting is changed around the start alone, and later set back in the query's own copy, the
session of the batches' DataFrames. A pipeline that chose a value itself keeps it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyspark.sql import DataFrame, SparkSession

WHOLE_STAGE_CODEGEN = "spark.sql.codegen.wholeStage"


@contextlib.contextmanager
def started_without_codegen(spark: SparkSession, when: bool = True) -> Iterator[bool]:
    """Queries started inside begin without whole-stage code generation; yields whether they
    do (not if ``when`` is false or the pipeline set it). ``codegen_on`` turns it on again."""
    chosen = spark.conf.get(WHOLE_STAGE_CODEGEN, None)
    if not when or chosen is not None:
        yield False
        return
    spark.conf.set(WHOLE_STAGE_CODEGEN, "false")
    try:
        yield True
    finally:
        spark.conf.unset(WHOLE_STAGE_CODEGEN)


def codegen_on(batch: DataFrame) -> None:
    """Whole-stage code generation for the later batches of the query ``batch`` is a batch of."""
    batch._jdf.sparkSession().conf().set(WHOLE_STAGE_CODEGEN, "true")
