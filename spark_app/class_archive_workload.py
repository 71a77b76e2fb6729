"""The pipeline a class archive is recorded from (spark_app.runtime.jvm.class_archive).

A little of everything a driver loads classes for: the file sources (CSV and JSON lines,
one malformed row), a stateful aggregation on the RocksDB state store, JSON-lines and
Delta outputs, and an iterate fixed point with its Delta store. It runs to the end of its
input, then ends its JVM and waits for it, because the JVM writes the archive as it exits.

    python -m spark_app.class_archive_workload WORK_FOLDER
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import spark_app as sa


def _min_label(labels: DataFrame, edges: DataFrame) -> dict[str, DataFrame]:
    offers = labels.join(edges.withColumnRenamed("u", "vertex"), "vertex").select(F.col("v").alias("vertex"), "label")
    best = labels.unionByName(offers).groupBy("vertex").agg(F.min("label").alias("label"))
    return {"labels": best}


def main(work: Path) -> None:
    (work / "words").mkdir(parents=True)
    (work / "words" / "a.csv").write_text("word,n\nspark,1\ndelta,2\nspark,x\n")
    (work / "edges").mkdir()
    (work / "edges" / "a.jsonl").write_text("\n".join(f'{{"u": {i}, "v": {i + 1}}}' for i in range(5)) + "\n")

    words = sa.io.csv.read(str(work / "words"), schema="word STRING, n INT", persistent_id="words")
    counts = words.groupBy("word").agg(F.count("*").alias("count"), F.sum("n").alias("total"))
    sa.io.jsonlines.write(counts, str(work / "counts.jsonlines"))
    sa.io.delta.write(counts, str(work / "counts.delta"))
    edges = sa.io.jsonlines.read(str(work / "edges"), schema="u BIGINT, v BIGINT", persistent_id="edges")
    labels = edges.select(F.col("u").alias("vertex"), F.col("u").alias("label"))
    result = sa.iterate(_min_label, persistent_id="labels", monotone=True, labels=labels, edges=edges)
    sa.io.jsonlines.write(result.labels, str(work / "labels.jsonlines"))
    sa.run(persistence_config=sa.persistence.Config.simple_config(sa.persistence.Backend.filesystem(str(work / "state"))),
           trigger_interval_ms=200, stop_when_idle=True)

    gateway = SparkContext._gateway
    assert gateway is not None  # run() started the JVM
    SparkContext.getOrCreate().stop()
    gateway.proc.stdin.close()  # the JVM exits when its driver's pipe closes, and dumps the archive
    gateway.proc.wait(timeout=600)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
