"""One Delta writer in a process of its own, driven line by line (test_delta_commits.py,
test_table_backfill.py, test_shared_backfill.py).

    python -m tests.integration.spark_app.delta_writer ENDPOINT_URL [SPARK_CONF_JSON]

It builds the session spark_app builds for an S3 backend at ENDPOINT_URL (with the extra
Spark settings of SPARK_CONF_JSON), answers "ready", then runs one command per line of
its standard input and answers each with one line on standard output:

    append URI LABEL ROWS   appends ROWS rows labelled LABEL to the Delta table at URI, with
                            LABEL as the commit's userMetadata -> "appended"
    put-if-absent URI TEXT  writes the log file URI holding the one line TEXT through the
                            session's LogStore for s3a (overwrite=false) -> "written", or
                            "exists" if it raised java.nio.file.FileAlreadyExistsException

    create URI ROWS         creates a Delta table of ROWS rows (id BIGINT, value BIGINT) with
                            its change data feed on -> "created"
    merge URI JSON          one MERGE into it: {"upsert": [[id, value], ...], "delete": [id, ...]}
                            -> "merged <version>"
    unset-property URI NAME removes the table property NAME of the Delta table at URI (a
                            table as an older writer left it) -> "unset"

A failure answers "failed <Java exception class>: <message>".
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from functools import reduce
from pathlib import Path

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_app.persistence import Backend
from spark_app.runtime.jvm.conf import spark_conf
from spark_app.runtime.jvm.session import build_session

REPO = Path(__file__).resolve().parents[3]

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


def create(spark: SparkSession, uri: str, rows: str) -> str:
    (spark.range(int(rows)).select(F.col("id"), (F.col("id") * 10).alias("value"))
     .write.format("delta").option("delta.enableChangeDataFeed", "true").save(uri))
    return "created"


def unset_property(spark: SparkSession, uri: str, name: str) -> str:
    spark.sql(f"ALTER TABLE delta.`{uri}` UNSET TBLPROPERTIES ('{name}')")
    return "unset"


def merge(spark: SparkSession, uri: str, change: str) -> str:
    from delta.tables import DeltaTable

    body = json.loads(change)
    rows = [(int(i), int(v), "u") for i, v in body.get("upsert", [])] + [(int(i), 0, "d") for i in body.get("delete", [])]
    source = spark.createDataFrame(rows, "id BIGINT, value BIGINT, op STRING")
    (DeltaTable.forPath(spark, uri).alias("t").merge(source.alias("s"), "t.id = s.id")
     .whenMatchedDelete(condition="s.op = 'd'")
     .whenMatchedUpdate(condition="s.op = 'u'", set={"value": "s.value"})
     .whenNotMatchedInsert(condition="s.op = 'u'", values={"id": "s.id", "value": "s.value"})
     .execute())
    return f"merged {DeltaTable.forPath(spark, uri).history(1).collect()[0]['version']}"


def main() -> None:
    endpoint_url, *extra = sys.argv[1:]
    backend = Backend.s3("s3://unused", endpoint_url=endpoint_url)
    spark = build_session(spark_conf(backend, 10_000, {**SETTINGS, **json.loads(extra[0] if extra else "{}")}))
    # Each command with its number of arguments: the last one takes the rest of the line
    # (a text or a JSON body may hold spaces).
    commands = {"append": (append, 3), "put-if-absent": (put_if_absent, 2), "create": (create, 2),
                "merge": (merge, 2), "unset-property": (unset_property, 2)}
    print(ANSWER + "ready", flush=True)
    for line in sys.stdin:
        command, _, rest = line.strip().partition(" ")
        run, arity = commands[command]
        try:
            answer = run(spark, *rest.split(maxsplit=arity - 1))
        except Py4JJavaError as error:
            java = error.java_exception
            answer = f"failed {java.getClass().getName()}: {java.getMessage()}"
        print(ANSWER + answer, flush=True)
    spark.stop()


class Writer:
    """A delta_writer process: commands in on its standard input, answers out."""

    def __init__(self, endpoint_url: str, spark_conf: dict[str, str], log: Path) -> None:
        with open(log, "ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.spark_app.delta_writer", endpoint_url,
                 json.dumps(spark_conf)],
                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                start_new_session=True,
            )
        self.log = log
        self._answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(ANSWER):
                self._answers.put(line[len(ANSWER):].strip())

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def answer(self, timeout: float = 120) -> str:
        try:
            return self._answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no answer within {timeout}s:\n{self.log.read_text()[-3000:]}") from None

    def ask(self, command: str, timeout: float = 120) -> str:
        self.send(command)
        return self.answer(timeout)

    def call(self, command: str, timeout: float = 120) -> str:
        """``ask``, failing unless it succeeded."""
        answer = self.ask(command, timeout)
        assert not answer.startswith("failed"), f"{command.split()[0]}: {answer}"
        return answer

    def freeze(self) -> None:
        """SIGSTOP to the writer's Python process and its JVM."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)


if __name__ == "__main__":
    main()
