"""The pipeline a class archive is recorded from (spark_app.runtime.jvm.class_archive).

A little of everything a driver loads classes for: the file sources (CSV and JSON lines,
one malformed row), a stateful aggregation on the RocksDB state store, JSON-lines and
Delta outputs, an iterate fixed point with its Delta store, S3A with the AWS SDK (a client
built and one request refused: no S3 server is needed), and the checkpoint metadata a
resumed driver reads (jvm.metadata_warm_up). It runs to the end of
its input, then ends its JVM and waits for it, because the JVM writes the archive as it
exits.

    python -m spark_app.class_archive_workload WORK_FOLDER
"""

from __future__ import annotations

import sys
from pathlib import Path

from py4j.protocol import Py4JJavaError
from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import spark_app as sa
from spark_app.persistence import Backend
from spark_app.runtime.jvm import metadata_warm_up
from spark_app.runtime.jvm.conf import s3a_conf

NOTHING_LISTENS = "http://127.0.0.1:9"
"""The discard port: a request to it is refused at once."""


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

    _touch_s3a(SparkContext.getOrCreate())
    # What a resumed driver's warm-up loads (json4s's reflection over the checkpoint
    # metadata's classes), which this run from empty state never reads.
    metadata_warm_up.start(SparkSession.builder.getOrCreate(), [True]).get()
    gateway = SparkContext._gateway
    assert gateway is not None  # run() started the JVM
    SparkContext.getOrCreate().stop()
    gateway.proc.stdin.close()  # the JVM exits when its driver's pipe closes, and dumps the archive
    gateway.proc.wait(timeout=600)


def _touch_s3a(context: SparkContext) -> None:
    """S3A's and the AWS SDK's classes, which a driver with its state on S3 loads before its
    first batch: without them in the archive its query took 1.8 s to start against 0.7 s on
    a volume (bench/resume)."""
    jvm = context._jvm
    assert jvm is not None
    conf = jvm.org.apache.hadoop.conf.Configuration(context._jsc.hadoopConfiguration())
    for key, value in s3a_conf(Backend.s3("s3a://class-archive/state", endpoint_url=NOTHING_LISTENS)).items():
        conf.set(key.removeprefix("spark.hadoop."), value)
    for key, value in {"fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                       "fs.s3a.access.key": "class-archive", "fs.s3a.secret.key": "class-archive",
                       "fs.s3a.retry.limit": "0", "fs.s3a.attempts.maximum": "1"}.items():
        conf.set(key, value)
    uri = jvm.java.net.URI("s3a://class-archive/")
    fs = jvm.org.apache.hadoop.fs.FileSystem.newInstance(uri, conf)
    try:
        fs.exists(jvm.org.apache.hadoop.fs.Path("s3a://class-archive/state/log"))
    except Py4JJavaError:
        pass  # refused, as it should be: the request path's classes are loaded
    finally:
        fs.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
