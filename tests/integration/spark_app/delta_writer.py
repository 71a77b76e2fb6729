"""One Delta writer in a process of its own, driven line by line (test_delta_commits.py).

    python -m tests.integration.spark_app.delta_writer ENDPOINT_URL [SPARK_CONF_JSON]

It builds the session spark_app builds for an S3 backend at ENDPOINT_URL (with the extra
Spark settings of SPARK_CONF_JSON), answers "ready", then runs one command per line of
its standard input and answers each with one line on standard output:

    append URI LABEL ROWS   appends ROWS rows labelled LABEL to the Delta table at URI, with
                            LABEL as the commit's userMetadata -> "appended"
    put-if-absent URI TEXT  writes the log file URI holding the one line TEXT through the
                            session's LogStore for s3a (overwrite=false) -> "written", or
                            "exists" if it raised java.nio.file.FileAlreadyExistsException

A failure answers "failed <Java exception class>: <message>".
"""

from __future__ import annotations

import json
import sys
from functools import reduce

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_app.persistence import Backend
from spark_app.runtime.jvm.session import build_session, spark_conf

ANSWER = "writer: "
SETTINGS = {"spark.master": "local[1]", "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1"}


def append(spark: SparkSession, uri: str, label: str, rows: str) -> str:
    (spark.range(int(rows)).withColumn("label", F.lit(label))
     .write.format("delta").mode("append").option("userMetadata", label).save(uri))
    return "appended"


def put_if_absent(spark: SparkSession, uri: str, text: str) -> str:
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    store_class = reduce(getattr, spark.conf.get("spark.delta.logStore.s3a.impl").split("."), jvm)
    lines = jvm.java.util.ArrayList()
    lines.add(text)
    try:
        store_class(conf).write(jvm.org.apache.hadoop.fs.Path(uri), lines.iterator(), False, conf)
    except Py4JJavaError as error:
        if error.java_exception.getClass().getName() == "java.nio.file.FileAlreadyExistsException":
            return "exists"
        raise
    return "written"


def main() -> None:
    endpoint_url, *extra = sys.argv[1:]
    backend = Backend.s3("s3://unused", endpoint_url=endpoint_url)
    spark = build_session(spark_conf(backend, 10_000, {**SETTINGS, **json.loads(extra[0] if extra else "{}")}))
    commands = {"append": append, "put-if-absent": put_if_absent}
    print(ANSWER + "ready", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        try:
            answer = commands[command](spark, *args)
        except Py4JJavaError as error:
            java = error.java_exception
            answer = f"failed {java.getClass().getName()}: {java.getMessage()}"
        print(ANSWER + answer, flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
