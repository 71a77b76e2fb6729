"""The session spark_app builds: what its Python workers run on, the class archive its JVM maps,
what its start and first batches leave out (Scala's runtime reflection), what a resumed driver
reads beside its start (Spark's checkpoint metadata), the requests its start makes of S3, and the
Kafka connector on its class path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from bench.resume.round_trips import RoundTrips
from spark_app.persistence import Backend
from spark_app.runtime.jvm import class_archive, metadata_warm_up, start_up_methods
from spark_app.runtime.jvm.conf import spark_conf
from spark_app.runtime.jvm.jars import jars_dir
from spark_app.runtime.jvm.session import build_session
from tests.integration.spark_app.harness import (
    Driver,
    Workspace,
    fold,
    read_changelog,
    spark_conf_env,
    write_csv,
)
from tests.integration.spark_app.words import expected_counts, rows
from tests.support.kafka import KafkaBroker, Message
from tests.support.s3 import S3Server

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield build_session(spark_conf(Backend.filesystem("/tmp"), 10_000,
                                   {"spark.master": "local[2]", "spark.ui.enabled": "false"}))


def test_python_workers_import_the_installed_pyspark_rather_than_sparks_zipped_copy(spark: SparkSession) -> None:
    def probe(_: object) -> Iterator[tuple[str, list[str]]]:
        import sys

        import pyspark as worker_pyspark

        yield worker_pyspark.__file__, sys.path

    [(imported, path)] = spark.sparkContext.parallelize([0], 1).mapPartitions(probe).collect()
    installed = Path(pyspark.__file__).parent.resolve()
    assert Path(imported).parent.resolve() == installed
    assert not [entry for entry in path if Path(entry).resolve().is_relative_to(installed)]


def test_a_python_data_source_is_resolved_without_a_process_looking_for_others(spark: SparkSession) -> None:
    """Spark starts a Python daemon to look for ``pyspark_*`` modules before it resolves a
    Python data source's name; with none on the path, the session has told it there are none."""

    class OnesReader(DataSourceReader):  # defined here, so that the workers unpickle it by value
        def read(self, partition: object) -> Iterator[tuple[int]]:
            yield (1,)

    class Ones(DataSource):
        @classmethod
        def name(cls) -> str:
            return "spark_app_test_ones"

        def schema(self) -> str:
            return "n int"

        def reader(self, schema: StructType) -> DataSourceReader:
            return OnesReader()

    spark.dataSource.register(Ones)
    assert spark.read.format("spark_app_test_ones").load().collect() == [(1,)]
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    children = [_command_line(pid) for pid in _children(jvm_pid)]
    assert any(b"pyspark.sql.worker.create_data_source" in c for c in children), children
    assert not [c for c in children if b"lookup_data_sources" in c]


def test_a_pipeline_starts_no_python_process_to_plan_its_file_sources(fs_workspace: Workspace,
                                                                      tmp_path: Path) -> None:
    """The file sources plan in the driver's own Python process (spark_app.runtime.sources.
    planned): the Python processes Spark starts are its workers' alone. As a Spark Python
    data source, each start ran three more (to create the source, to plan its stream, to
    prepare its read), each importing pyspark and spark_app before the first batch."""
    started = tmp_path / "python-processes"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$*" >> {started}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    write_csv(fs_workspace.inputs, "part-0.csv", "word,n", rows(0))
    driver = fs_workspace.driver("--stop-when-idle", env={"PYSPARK_PYTHON": str(python),
                                                          "PYSPARK_DRIVER_PYTHON": str(python)}).start()
    assert driver.wait() == 0, driver.output()[-3000:]
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(1))
    commands = started.read_text().splitlines()
    assert any("pyspark.daemon" in c for c in commands), commands
    assert not [c for c in commands if "source" in c or "data_source" in c], commands


def test_neither_a_pipelines_driver_nor_its_workers_import_pandas(fs_workspace: Workspace, tmp_path: Path) -> None:
    """pandas costs a Python process 0.3 to 0.4 s to import on the test machine, and nothing
    of a pipeline uses it; pyspark imported it in the driver (mapInArrow's function, the
    numpy converters) and pyarrow in each worker (the parser's row mask, built from Python
    values for every file; runtime/jvm/map_in_arrow.py, sources/parsing.py)."""
    imports = tmp_path / "pandas-imports"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import importlib.abc, os, sys\n"
        "class Watch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'pandas':\n"
        f"            with open({str(imports)!r}, 'a') as f:\n"
        "                f.write(f'{os.getpid()} {sys.argv}\\n')\n"
        "        return None\n"
        "sys.meta_path.insert(0, Watch())\n")
    write_csv(fs_workspace.inputs, "part-0.csv", "word,n", [*rows(0), "bad,not-a-number"])
    driver = fs_workspace.driver("--stop-when-idle", env={"PYTHONPATH": str(hook)}).start()
    assert driver.wait() == 0, driver.output()[-3000:]
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(1))
    assert not imports.exists(), imports.read_text()


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:  # a worker that ended meanwhile
        return b""


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return found


_JVM_PROBE = """
import json, sys
from pathlib import Path

def children():
    found = []
    for task in Path("/proc/self/task").iterdir():
        found += [int(pid) for pid in (task / "children").read_text().split()]
    return found

def alive_jvms():
    # The JVM keeps its launcher's pid (spark-submit and spark-class exec it); a stopped
    # one was reaped.
    return [pid for pid in children() if Path(f"/proc/{pid}/cmdline").read_bytes().find(b"spark") >= 0]

report = {"pyspark_loaded": "pyspark" in sys.modules, "children": children()}
if sys.argv[2] == "own-session-first":
    from pyspark.sql import SparkSession
    SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
from spark_app.runtime.pipeline import current
spark = current().spark()
report["session_jvm"] = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
report["alive_jvms"] = alive_jvms()
Path(sys.argv[1]).write_text(json.dumps(report))
"""


def _probe_driver(tmp_path: Path, mode: str) -> dict[str, Any]:
    pipeline = tmp_path / "probe.py"
    pipeline.write_text(_JVM_PROBE)
    report = tmp_path / "report.json"
    driver = Driver([str(pipeline), str(report), mode], tmp_path / "driver.log").start()
    assert driver.wait() == 0, driver.output()[-3000:]
    return json.loads(report.read_text())


def test_a_driver_starts_its_jvm_before_the_pipeline_imports_pyspark_and_its_session_runs_on_it(
        tmp_path: Path) -> None:
    """The JVM starts while Python imports (spark_app.runtime.jvm.launch): when the pipeline
    file begins, pyspark is not loaded and the JVM's process already runs; the session's
    JVM is that process, and no other was started."""
    report = _probe_driver(tmp_path, "spark_app-session")
    assert not report["pyspark_loaded"]
    assert report["session_jvm"] in report["children"], report
    assert report["alive_jvms"] == [report["session_jvm"]], report


def test_a_session_the_pipeline_starts_itself_leaves_no_second_jvm_running(tmp_path: Path) -> None:
    """A pipeline that builds its own session first gets the JVM pyspark starts for it, with
    its own options; the one started early is stopped when spark_app finds that session."""
    report = _probe_driver(tmp_path, "own-session-first")
    assert report["session_jvm"] not in report["children"], report
    assert report["alive_jvms"] == [report["session_jvm"]], report


def test_the_driver_jvm_maps_the_class_archive_recorded_for_its_jvm_and_jars(spark: SparkSession) -> None:
    archive = class_archive.archive_path(jars_dir())
    assert archive is not None and archive.is_file(), "no class archive for this JVM and jars: run `make setup`"
    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={archive}" in arguments
    # -Xshare:on turns "map it if you can" into "fail unless it maps": the archive is valid
    # for this JVM with the driver's class path.
    classpath = jvm.java.lang.System.getProperty("java.class.path")
    java = os.path.join(jvm.java.lang.System.getProperty("java.home"), "bin", "java")
    check = subprocess.run([java, "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", classpath, "-version"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_the_driver_jvm_keeps_its_start_up_only_methods_from_c2(spark: SparkSession) -> None:
    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:CompilerDirectivesFile={start_up_methods.DIRECTIVES}" in arguments
    # The directives in force, as the JVM lists them.
    jcmd = os.path.join(jvm.java.lang.System.getProperty("java.home"), "bin", "jcmd")
    printed = subprocess.run([jcmd, str(jvm.java.lang.ProcessHandle.current().pid()), "Compiler.directives_print"],
                             capture_output=True, text=True, check=True).stdout
    matched = next(line for line in printed.splitlines() if line.strip().startswith("matching:"))
    listed = json.loads(start_up_methods.DIRECTIVES.read_text())[0]["match"]
    assert sorted(m.strip() for m in matched.split(":", 1)[1].split(",")) == sorted(listed)
    assert "Exclude:true" in printed.split("c2 directives:", 1)[1].split("Directive:", 1)[0]


def test_the_driver_jvm_loads_rocksdbs_library_from_the_folder_unpacked_once(spark: SparkSession) -> None:
    folder = class_archive.library_path(class_archive.archive_path(jars_dir()))
    assert folder is not None, "RocksDB's library is not unpacked for this JVM and jars: run `make setup`"
    jvm = spark.sparkContext._jvm
    jvm.org.rocksdb.RocksDB.loadLibrary()  # as a state store's first load does
    maps = Path(f"/proc/{jvm.java.lang.ProcessHandle.current().pid()}/maps").read_text()
    loaded = {line.split()[-1] for line in maps.splitlines() if "librocksdbjni" in line}
    # Not a copy in the JVM's temporary folder.
    assert loaded and {os.path.dirname(path) for path in loaded} == {os.path.realpath(folder)}, loaded


def test_a_drivers_start_and_first_batches_never_start_scalas_runtime_reflection(fs_workspace: Workspace,
                                                                                 tmp_path: Path) -> None:
    """Scala's runtime reflection (its universe, built once per JVM) cost a new driver about
    0.7 s: spark-mllib's functions registered in every session (below), and the external rows
    the JVM changelog encoder and the batch's fetch had Spark decode, whose generated code
    names methods through it (tools/jars/java/dev/sparkapp/sinks). The two-output pipeline,
    a keyed count and an append output, from its start to its clean stop."""
    loaded = tmp_path / "classes.log"
    write_csv(fs_workspace.inputs, "part-0.csv", "word,n", rows(0))
    driver = fs_workspace.driver("--stop-when-idle", env=spark_conf_env(**{
        "spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={loaded}"})).start()
    assert driver.wait() == 0, driver.output()[-3000:]
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(1))
    classes = loaded.read_text()
    assert " org.apache.spark.sql.classic.SparkSession source:" in classes  # the driver's JVM wrote it
    assert " scala.reflect.runtime.JavaUniverse source:" not in classes


WARM_UP_THREAD = "spark_app-checkpoint-metadata-warm-up"
JSON4S_SIGNATURE_PARSER = "org/json4s/scalap/scalasig/ScalaSigParser$"


def test_a_resumed_driver_reads_sparks_checkpoint_metadata_beside_its_start_and_a_new_one_does_not(
        fs_workspace: Workspace, tmp_path: Path) -> None:
    """json4s describes a class the first time it reads one, by parsing its Scala signature
    cold: 0.3 to 0.4 s of CPU in the first state store task on each core of a resumed driver
    (runtime/jvm/metadata_warm_up.py). Read off each driver JVM's class loads (JFR, which
    names the loading thread): a resumed driver builds the descriptions of the commit log's and
    the state stores' metadata on the warm-up thread; a driver on empty state starts none."""
    loads = []
    for number in range(2):
        write_csv(fs_workspace.inputs, f"part-{number}.csv", "word,n", rows(number))
        driver = fs_workspace.driver("--stop-when-idle", env=spark_conf_env(**{
            "spark.driver.extraJavaOptions": _class_load_recording(tmp_path / f"run-{number}")})).start()
        assert driver.wait() == 0, driver.output()[-3000:]
        loads.append(_loaders(tmp_path / f"run-{number}"))
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(2))
    fresh, resumed = loads
    assert WARM_UP_THREAD not in fresh.values(), fresh
    first = {name: resumed.get(name) for name in (
        JSON4S_SIGNATURE_PARSER, "org/apache/spark/sql/execution/streaming/checkpointing/CommitMetadata",
        "org/apache/spark/sql/execution/streaming/state/RocksDBSstFile")}
    assert first == dict.fromkeys(first, WARM_UP_THREAD), first


def test_the_warm_ups_samples_of_checkpoint_metadata_read_as_the_pinned_spark_reads_its_own(
        spark: SparkSession) -> None:
    """The samples have the fields Spark 4.1.2 writes: a Spark that reads them differently
    fails the warm-up (which then saves nothing), and this test, rather than going unseen."""
    assert metadata_warm_up.start(spark, []) is None  # no query resumes: nothing to read
    metadata_warm_up.start(spark, [False, True]).get()


def _class_load_recording(folder: Path) -> str:
    """Java options for a JFR recording of class loads, with their threads, into ``folder``
    (its repository too: the driver clears its JVM's scratch folder as it exits)."""
    folder.mkdir()
    settings = folder / "class-loads.jfc"
    settings.write_text('<?xml version="1.0" encoding="UTF-8"?><configuration version="2.0">'
                        '<event name="jdk.ClassLoad"><setting name="enabled">true</setting>'
                        '<setting name="threshold">0 ms</setting></event></configuration>')
    return (f"-XX:FlightRecorderOptions=repository={folder} "
            f"-XX:StartFlightRecording=filename={folder / 'loads.jfr'},dumponexit=true,settings={settings}")


def _loaders(folder: Path) -> dict[str, str]:
    """Each class the recording in ``folder`` saw loaded, and the thread that loaded it (a
    class is loaded once; a name loaded by two class loaders keeps the first seen)."""
    jfr = Path(os.path.realpath(shutil.which("java") or "java")).with_name("jfr")
    printed = subprocess.run([str(jfr), "print", "--json", "--events", "jdk.ClassLoad", str(folder / "loads.jfr")],
                             capture_output=True, text=True, check=True).stdout
    loaders: dict[str, str] = {}
    for event in json.loads(printed)["recording"]["events"]:
        values = event["values"]
        loaders.setdefault(values["loadedClass"]["name"], values["eventThread"]["javaName"])
    return loaders


@pytest.mark.parametrize("chosen", [None, "false"])
def test_a_querys_first_batch_runs_without_whole_stage_code_generation_and_its_later_batches_with_it(
        fs_workspace: Workspace, tmp_path: Path, chosen: str | None) -> None:
    """In a new JVM, generating and compiling a stage's code cost a first batch more than it
    saved (runtime/jvm/first_batch.py). Read off Spark's event log: the physical plan of each
    batch of both queries, three files a batch at a time. A pipeline that set it keeps it."""
    events = tmp_path / "events"
    events.mkdir()
    for i in range(3):
        write_csv(fs_workspace.inputs, f"part-{i}.csv", "word,n", rows(i))
    conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(events), "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false", **({"spark.sql.codegen.wholeStage": chosen} if chosen else {})}
    driver = fs_workspace.driver("--stop-when-idle", "--max-files-per-trigger", "1", env=spark_conf_env(**conf)).start()
    assert driver.wait() == 0, driver.output()[-3000:]
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(3))
    stages = _code_generated_stages(events)
    assert sorted(stages) == [(q, b) for q in ("counts_jsonlines", "even_jsonlines") for b in range(3)], stages
    if chosen is None:
        assert {key: count > 0 for key, count in stages.items()} == {(q, b): b > 0 for q, b in stages}, stages
    else:
        assert set(stages.values()) == {0}, stages


def _code_generated_stages(events: Path) -> dict[tuple[str, int], int]:
    """Each streaming batch's whole-stage code-generated stages, by (query, batch), from the
    SQL executions of Spark's event log (a batch's description ends with "batch = N")."""
    def count(plan: dict[str, Any]) -> int:
        return plan["nodeName"].startswith("WholeStageCodegen") + sum(count(c) for c in plan.get("children", []))

    found = {}
    for path in events.iterdir():
        for line in path.read_text().splitlines():
            event = json.loads(line)
            description = event.get("description", "").split("\n")
            if event["Event"].endswith("SQLExecutionStart") and description[-1].startswith("batch = "):
                found[(description[0], int(description[-1].removeprefix("batch = ")))] = count(event["sparkPlanInfo"])
    return found


def test_sparks_ml_functions_are_built_when_a_query_first_names_one_and_work_as_sparks(spark: SparkSession) -> None:
    """spark-mllib registers its functions in every session's start, building typed UDFs whose
    type tags start Scala's runtime reflection; spark_app's class of the same name, ahead of
    Spark's jars, registers the same names with builders that run Spark's own registration on
    first use (tools/jars/java/org/apache/spark/sql/ml). Nothing else here uses ML functions,
    and the registry is the JVM's, so this test sees the state the session's start left."""
    from pyspark.ml.functions import array_to_vector, vector_to_array
    from pyspark.ml.linalg import DenseVector, Vectors
    from pyspark.ml.stat import Summarizer

    jvm = spark.sparkContext._jvm
    registry = getattr(getattr(jvm.org.apache.spark.sql.catalyst.analysis, "FunctionRegistry$"), "MODULE$").internal()

    def names() -> set[str]:
        return {f.funcName() for f in jvm.scala.jdk.javaapi.CollectionConverters.asJava(registry.listFunction())}

    def builder(name: str) -> str:
        found = registry.lookupFunctionBuilder(jvm.org.apache.spark.sql.catalyst.FunctionIdentifier.apply(name))
        return str(found.get().getClass().getName())

    ml_functions = ["vector_to_array", "array_to_vector", "aggregate_metrics"]
    before = names()
    assert [builder(name) for name in ml_functions] == [
        "org.apache.spark.sql.ml.InternalFunctionRegistration$Deferred"] * 3

    vectors = spark.createDataFrame([(Vectors.dense([1.0, 2.0]),), (Vectors.sparse(2, [1], [4.0]),)], ["v"])
    assert [r.a for r in vectors.select(vector_to_array("v").alias("a")).collect()] == [[1.0, 2.0], [0.0, 4.0]]
    assert [r.a for r in vectors.select(vector_to_array("v", "float32").alias("a")).collect()] == [[1.0, 2.0],
                                                                                                   [0.0, 4.0]]
    arrays = spark.createDataFrame([([3.0, 5.0],)], ["a"])
    assert arrays.select(array_to_vector("a").alias("v")).first().v == DenseVector([3.0, 5.0])
    assert vectors.select(Summarizer.mean(vectors.v).alias("m")).first().m == DenseVector([0.5, 3.0])
    # Spark's own registration has run and replaced each builder, and registered no name
    # beyond these three: a Spark version that adds one fails here.
    assert not [name for name in ml_functions if builder(name).endswith("$Deferred")]
    assert names() == before


@pytest.mark.kafka
def test_the_session_reads_a_kafka_topic_with_the_connector_on_its_class_path(
    spark: SparkSession, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic = kafka_broker.new_topic(partitions=2)
    kafka_broker.produce(topic, [Message(b"a", b"1", partition=0), Message(b"b", b"2", partition=1)], "w")
    kafka_broker.produce(topic, [Message(b"c", b"aborted", partition=0)], "w", abort=True)
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    query = (
        stream.selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "partition")
        .writeStream.format("memory").queryName("kafka_read").trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )  # fmt: skip
    query.awaitTermination(120)
    assert query.exception() is None
    rows = spark.sql("SELECT key, value, partition FROM kafka_read ORDER BY partition").collect()
    assert [tuple(row) for row in rows] == [("a", "1", 0), ("b", "2", 1)]


def test_local_files_are_written_through_the_file_system_that_sets_permissions_in_process(
        spark: SparkSession, tmp_path: Path) -> None:
    """Hadoop without its native library set each local file's permissions with a chmod
    process: a state store's first load over 1,000 batches of history started 8,000 of them
    (25 s). The session's file: is ours, for FileSystem and FileContext alike, and sets the
    permissions it is asked for."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    uri = jvm.java.net.URI("file:///")
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(uri, conf)
    assert fs.getClass().getName() == "dev.sparkapp.fs.NioLocalFileSystem"
    assert fs.getRawFileSystem().getClass().getName() == "dev.sparkapp.fs.NioRawLocalFileSystem"
    context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(uri, conf)
    assert context.getDefaultFileSystem().getClass().getName() == "dev.sparkapp.fs.NioLocalFs"

    path = jvm.org.apache.hadoop.fs.Path(str(tmp_path / "file"))
    permission = jvm.org.apache.hadoop.fs.permission.FsPermission
    stream = fs.create(path, permission.createImmutable(0o640), True, 4096, 1, 1 << 20, None)
    stream.write(bytearray(b"state"))
    stream.close()
    assert (tmp_path / "file").stat().st_mode & 0o777 == 0o640
    fs.setPermission(path, permission.createImmutable(0o600))
    assert (tmp_path / "file").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / ".file.crc").is_file()


def _children_page_faults(pid: int) -> int:
    """Minor page faults of the process's children that it has waited for (/proc's cminflt):
    every process the JVM starts and reaps adds a hundred or more."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[8])  # field 11 of stat(5), counted from the state (field 3)


def test_a_rename_through_file_context_starts_no_process(spark: SparkSession, tmp_path: Path) -> None:
    """Spark renames every checkpoint file into place through FileContext, and Hadoop (without
    its native library) asked a readlink process whether each side of the rename was a
    symbolic link: 101 processes in one driver's start on a small state (traced). A link is
    still seen as one."""
    jvm = spark.sparkContext._jvm
    context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(
        jvm.java.net.URI("file:///"), spark.sparkContext._jsc.hadoopConfiguration())
    hadoop_path = jvm.org.apache.hadoop.fs.Path
    overwrite = spark.sparkContext._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
    overwrite[0] = jvm.org.apache.hadoop.fs.Options.Rename.OVERWRITE
    jvm_pid = jvm.java.lang.ProcessHandle.current().pid()

    before = _children_page_faults(jvm_pid)
    for n in range(20):
        (tmp_path / f"{n}.tmp").write_text(str(n))
        context.rename(hadoop_path(f"file://{tmp_path}/{n}.tmp"), hadoop_path(f"file://{tmp_path}/{n}"), overwrite)
    assert _children_page_faults(jvm_pid) == before
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == list(range(20))

    (tmp_path / "link").symlink_to(tmp_path / "0")
    raw = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"),
                                                  spark.sparkContext._jsc.hadoopConfiguration()).getRawFileSystem()
    assert raw.getFileLinkStatus(hadoop_path(str(tmp_path / "link"))).isSymlink()
    assert not raw.getFileLinkStatus(hadoop_path(str(tmp_path / "1"))).isSymlink()


def test_a_file_copied_to_a_local_folder_is_verified_and_written_without_a_checksum_file(
        spark: SparkSession, tmp_path: Path) -> None:
    jvm = spark.sparkContext._jvm
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"),
                                                 spark.sparkContext._jsc.hadoopConfiguration())
    source = jvm.org.apache.hadoop.fs.Path(str(tmp_path / "source.sst"))
    stream = fs.create(source, True)
    stream.write(bytearray(b"x" * 10_000))
    stream.close()

    fs.copyToLocalFile(source, jvm.org.apache.hadoop.fs.Path(str(tmp_path / "local" / "copy.sst")))
    assert (tmp_path / "local" / "copy.sst").read_bytes() == b"x" * 10_000
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["copy.sst"]

    # The source is still read through its checksum: a damaged byte fails the copy.
    (tmp_path / "source.sst").write_bytes(b"x" * 9_999 + b"y")
    with pytest.raises(Exception, match="ChecksumException"):
        fs.copyToLocalFile(source, jvm.org.apache.hadoop.fs.Path(str(tmp_path / "local" / "again.sst")))


_HADOOP_CONF_PROBE = """
import json, sys
from pathlib import Path
import spark_app as sa
from spark_app.runtime.pipeline import current

report, inputs, output, state, endpoint = sys.argv[1:]
sa.io.jsonlines.write(sa.io.csv.read(inputs, schema="word STRING", persistent_id="words"), output)
sa.run(persistence_config=sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(state, endpoint_url=endpoint)),
       stop_when_idle=True)
hadoop = current().spark()._jsc.hadoopConfiguration()
Path(report).write_text(json.dumps({key: hadoop.get(key) for key in ("fs.s3a.retry.limit", "fs.s3a.endpoint")}))
"""


def test_a_local_runs_hadoop_settings_outlast_the_state_backends_own(tmp_path: Path, s3_server: S3Server) -> None:
    """A local run's SPARK_APP_SPARK_CONF is what its user asked of Spark, as a pipeline's
    sparkConf is under the operator: a ``spark.hadoop.*`` setting in it that the S3 state's
    defaults also name (S3A's retries here) is kept once the driver applies those defaults
    at its start, not silently replaced by them."""
    pipeline, report, inputs = tmp_path / "probe.py", tmp_path / "report.json", tmp_path / "inputs"
    pipeline.write_text(_HADOOP_CONF_PROBE)
    write_csv(inputs, "part-0.csv", "word", ["a"])
    state = f"s3://{s3_server.new_bucket()}/state"
    driver = Driver([str(pipeline), str(report), str(inputs), str(tmp_path / "out.jsonlines"), state,
                     s3_server.endpoint_url], tmp_path / "driver.log",
                    spark_conf_env(**{"spark.hadoop.fs.s3a.retry.limit": "9"})).start()
    assert driver.wait() == 0, driver.output()[-3000:]
    settings = json.loads(report.read_text())
    assert settings == {"fs.s3a.retry.limit": "9", "fs.s3a.endpoint": s3_server.endpoint_url}, settings


def test_a_driver_on_s3_probes_that_its_state_is_writable_once(tmp_path: Path, s3_server: S3Server) -> None:
    """Each request of a start waits a round trip on S3. The state's metadata and its
    snapshots share one root (under the operator always): the state session's probe of that
    root (a HEAD of the bucket, a probe object written and deleted) covers both, and the
    driver does not probe it again. Seen through a proxy that logs every request."""
    pipeline, report, inputs = tmp_path / "probe.py", tmp_path / "report.json", tmp_path / "inputs"
    pipeline.write_text(_HADOOP_CONF_PROBE)
    write_csv(inputs, "part-0.csv", "word", ["a"])
    bucket = s3_server.new_bucket()
    requests = RoundTrips(int(s3_server.endpoint_url.rsplit(":", 1)[1]), 0.0, tmp_path / "requests.log")
    try:
        driver = Driver([str(pipeline), str(report), str(inputs), str(tmp_path / "out.jsonlines"),
                         f"s3://{bucket}/state", requests.endpoint], tmp_path / "driver.log", spark_conf_env()).start()
        assert driver.wait() == 0, driver.output()[-3000:]
    finally:
        requests.stop()
    lines = [line.split(" ", 2)[2] for line in (tmp_path / "requests.log").read_text().splitlines()]
    assert lines.count(f"PUT /{bucket}/state/.probe/writable HTTP/1.1") == 1, lines
    assert lines.count(f"HEAD /{bucket} HTTP/1.1") == 1, lines


_CLASS_PATH_PROBE = """
import json, sys
from pathlib import Path
from spark_app.runtime.pipeline import current

jvm = current().spark().sparkContext._jvm
loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
Path(sys.argv[1]).write_text(json.dumps({
    "own": loader.getResource("dev/sparkapp/fs/NioLocalFileSystem.class") is not None,
    "users": loader.getResource("users-resource.txt") is not None,
}))
"""


def test_a_users_class_path_is_added_to_spark_apps_not_put_in_its_place(tmp_path: Path) -> None:
    """A pipeline that adds its own jars or classes with spark.driver.extraClassPath (a JDBC
    driver, a UDF library) replaced spark_app's jars folder with them, and its driver failed
    on spark_app's first class; both are on the class path, spark_app's first."""
    classes = tmp_path / "classes"
    classes.mkdir()
    (classes / "users-resource.txt").write_text("mine")
    pipeline, report = tmp_path / "probe.py", tmp_path / "report.json"
    pipeline.write_text(_CLASS_PATH_PROBE)
    driver = Driver([str(pipeline), str(report)], tmp_path / "driver.log",
                    spark_conf_env(**{"spark.driver.extraClassPath": str(classes)})).start()
    assert driver.wait() == 0, driver.output()[-3000:]
    assert json.loads(report.read_text()) == {"own": True, "users": True}
