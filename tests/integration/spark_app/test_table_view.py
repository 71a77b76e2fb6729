"""The Delta table as the backfill reads it, on real Spark and Delta: chunks in key order
for keys of several columns and types (nulls first, as orderBy sorts), changes split at
the position, and the checks made when a pipeline declares the source. Then the same
session's Delta tables as a shared table's compaction sees them: the file lists it carries
through the log, and the files its OPTIMIZE merges."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_app.persistence import Backend
from spark_app.runtime.jvm.conf import spark_conf
from spark_app.runtime.jvm.session import build_session
from spark_app.runtime.sources.backfill import START, Behind, Position
from spark_app.runtime.sources.delta_table import BackfillError, DeltaTableRef, DeltaTableView, describe_table

pytestmark = pytest.mark.spark

SCHEMA = "region STRING, day DATE, n BIGINT, amount DOUBLE"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield build_session(spark_conf(Backend.filesystem("/tmp"), 10_000,
                                   {"spark.master": "local[2]", "spark.ui.enabled": "false",
                                    "spark.sql.shuffle.partitions": "2"}))


def rows() -> list[tuple[str | None, dt.date, int, float]]:
    regions = [None, "eu", "us", "é-ü"]
    return [(regions[i % 4], dt.date(2026, 1, 1 + i % 3), i // 12, float(i)) for i in range(60)]


def table(spark: SparkSession, path: Path, change_data_feed: bool = True) -> DeltaTableRef:
    (spark.createDataFrame(rows(), SCHEMA).repartition(3).write.format("delta")
     .option("delta.enableChangeDataFeed", str(change_data_feed).lower()).save(str(path)))
    return DeltaTableRef(Backend.filesystem(path), ("region", "day", "n"))


def test_chunks_cover_every_row_once_in_key_order(spark: SparkSession, tmp_path: Path) -> None:
    ref = table(spark, tmp_path / "t")
    view = DeltaTableView(spark, ref, describe_table(spark, ref))
    version = view.latest_version()
    expected = [tuple(r) for r in spark.read.format("delta").load(str(tmp_path / "t"))
                .orderBy("region", "day", "n").select("region", "day", "n").collect()]
    position, read = START, []
    assert view.count(version, position) == 60
    while True:
        chunk = view.chunk(version, position, 7)
        keys = list(zip(*(chunk.rows.column(c).to_pylist() for c in ("region", "day", "n")), strict=True))
        read += keys
        if chunk.last is None:
            break
        position = Position(chunk.last)
        assert view.count(version, position) == 60 - len(read)
    assert read == expected
    assert set(chunk.rows.column_names) == {"region", "day", "n", "amount", "diff"}


def test_changes_are_split_at_the_position(spark: SparkSession, tmp_path: Path) -> None:
    from delta.tables import DeltaTable

    ref = table(spark, tmp_path / "t")
    view = DeltaTableView(spark, ref, describe_table(spark, ref))
    first = view.chunk(0, START, 20)  # up to ("eu", 2026-01-03, ...): the null regions and some of "eu"
    position = Position(first.last)
    source = spark.createDataFrame([(None, dt.date(2026, 1, 1), 0, -1.0), ("us", dt.date(2026, 1, 1), 0, -2.0)],
                                   SCHEMA)
    (DeltaTable.forPath(spark, str(tmp_path / "t")).alias("t")
     .merge(source.alias("s"), "t.region <=> s.region AND t.day = s.day AND t.n = s.n")
     .whenMatchedUpdateAll().execute())
    changes = view.changes(0, view.latest_version(), position)
    forwarded = sorted(zip(changes.forwarded.column("amount").to_pylist(),
                           changes.forwarded.column("diff").to_pylist(), strict=True))
    assert forwarded == [(-1.0, 1), (0.0, -1)]  # the read key's update; the other waits for its chunk
    assert changes.beyond == 0  # an update adds no row after the position


def test_a_table_without_its_change_data_feed_is_refused_with_the_fix(spark: SparkSession, tmp_path: Path) -> None:
    ref = table(spark, tmp_path / "t", change_data_feed=False)
    with pytest.raises(BackfillError, match="enableChangeDataFeed = true"):
        describe_table(spark, ref)
    with pytest.raises(BackfillError, match=r"key columns \['customer'\] are not columns"):
        describe_table(spark, DeltaTableRef(ref.location, ("customer",)))
    with pytest.raises(BackfillError, match="no Delta table at"):
        describe_table(spark, DeltaTableRef(Backend.filesystem(tmp_path / "nothing"), ("n",)))


def test_chunks_stay_whole_when_rows_counted_by_the_statistics_were_deleted(spark: SparkSession,
                                                                            tmp_path: Path) -> None:
    """Ten files of 100 keys in key order: a chunk reads only up to the file that completes
    it. Rows deleted after the view read the files' statistics leave the bounded read short;
    the chunk is read again without the bound, and no key is skipped."""
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    (spark.range(1000).repartitionByRange(10, "id").selectExpr("id", "id * 10 AS value")
     .write.format("delta").option("delta.enableChangeDataFeed", "true").save(path))
    ref = DeltaTableRef(Backend.filesystem(path), ("id",))
    view = DeltaTableView(spark, ref, describe_table(spark, ref))
    first = view.chunk(0, START, 150)
    assert first.rows.column("id").to_pylist() == list(range(150))
    DeltaTable.forPath(spark, path).delete("id >= 150 AND id < 400")
    second = view.chunk(view.latest_version(), Position(first.last), 200)
    assert second.rows.column("id").to_pylist() == list(range(400, 600))
    position, read = Position(second.last), []
    while (chunk := view.chunk(1, position, 128)).last is not None:
        read += chunk.rows.column("id").to_pylist()
        position = Position(chunk.last)
    assert read == list(range(600, 1000))


def test_a_data_file_gone_under_a_chunk_says_which_versions_are_gone(spark: SparkSession, tmp_path: Path) -> None:
    """The load succeeds (the log is whole), and the chunk's Spark job finds the file gone:
    the error names the table and the versions, as the load's own errors do."""
    path = tmp_path / "t"
    spark.range(100).selectExpr("id", "id AS value").write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(str(path))
    ref = DeltaTableRef(Backend.filesystem(path), ("id",))
    view = DeltaTableView(spark, ref, describe_table(spark, ref))
    for data in path.glob("*.parquet"):
        data.unlink()
    with pytest.raises(BackfillError, match=r"versions of the table at .* that this reader still needs .* are gone"):
        view.chunk(0, START, 10)


def test_versions_older_than_the_tables_deleted_file_retention_are_read_while_their_files_remain(
        spark: SparkSession, tmp_path: Path) -> None:
    """A published table keeps its tombstones for a minute only (publish.TABLE_PROPERTIES),
    and its versions for as long as a hold needs them. Delta refused a read of any version
    but the latest once it was older than that duration, files present or not: a reader
    that had lagged for a minute failed (CI, a shared backfill after a publisher restart)."""
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    (spark.range(100).selectExpr("id", "id AS value").write.format("delta")
     .option("delta.enableChangeDataFeed", "true")
     .option("delta.deletedFileRetentionDuration", "interval 1 seconds").save(path))
    DeltaTable.forPath(spark, path).update("id < 10", {"value": "-id"})
    time.sleep(2)  # versions 0 and 1 are now older than the retention; the latest is not
    DeltaTable.forPath(spark, path).update("id >= 90", {"value": "-id"})
    ref = DeltaTableRef(Backend.filesystem(path), ("id",))
    view = DeltaTableView(spark, ref, describe_table(spark, ref))
    assert view.latest_version() == 2
    assert view.chunk(1, START, 10).rows.column("value").to_pylist() == [-i for i in range(10)]
    assert view.count(1, START) == 100
    changes = view.changes(0, 1, Position(view.chunk(1, START, 5).last))
    assert sorted(changes.forwarded.column("diff").to_pylist()) == [-1] * 5 + [1] * 5


def test_a_chunk_read_at_an_older_version_gets_its_keys_changes_since_and_no_others(spark: SparkSession,
                                                                                     tmp_path: Path) -> None:
    """A chunk read ahead at version 0 (keys 5 to 14), handed over once plans of changes
    reached version 1: the changes of version 2 to keys already read, and of versions 1 and
    2 to the chunk's keys, nothing else; what is left to read counts the rest."""
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    (spark.range(100).selectExpr("id", "'v' AS value").write.format("delta")
     .option("delta.enableChangeDataFeed", "true").save(path))
    ref = DeltaTableRef(Backend.filesystem(path), ("id",))
    view = DeltaTableView(spark, ref, describe_table(spark, ref))
    position = Position(view.chunk(0, START, 5).last)  # keys 0 to 4 read
    ahead = view.chunk(0, position, 10)  # keys 5 to 14, read ahead at version 0
    table = DeltaTable.forPath(spark, path)
    table.update("id < 5 OR (id >= 10 AND id < 15)", {"value": "'v1'"})  # version 1
    table.delete("id = 7")  # version 2
    table.update("id IN (2, 12, 50)", {"value": "'v3'"})  # version 3
    table.delete("id = 60")  # version 4
    spark.createDataFrame([(200, "new")], "id BIGINT, value STRING").write.format("delta").mode("append").save(path)
    # Plans of changes handed versions 1 and 2 over for keys 0 to 4 (frontier at version 2).
    changes = view.changes(2, 5, position, Behind(0, Position(ahead.last)))
    forwarded = sorted(zip(changes.forwarded.column("id").to_pylist(), changes.forwarded.column("value").to_pylist(),
                           changes.forwarded.column("diff").to_pylist(), strict=True))
    assert forwarded == sorted([(2, "v1", -1), (2, "v3", 1), (7, "v", -1), (12, "v1", -1), (12, "v3", 1)]
                               + [(k, "v", -1) for k in range(10, 15)] + [(k, "v1", 1) for k in range(10, 15)])
    # Left after key 14 at version 5: 85 rows. Before: 94 after key 4 at version 2 (7 gone).
    assert 94 + changes.beyond - ahead.count == 85


def test_the_compactions_file_lists_equal_deltas_snapshot_at_every_version(spark: SparkSession, tmp_path: Path) -> None:
    """A shared table's compaction carries its frontier's files through the log's commits
    instead of reading the snapshot through Delta; the two agree after inserts, updates,
    deletes and an OPTIMIZE, and Delta's is taken once the log's first commits are gone."""
    from delta.tables import DeltaTable

    from spark_app.runtime.tables.compaction import CompactionSettings, Compactor
    from spark_app.state.tables import HoldRegistry

    path = tmp_path / "customers"
    (spark.createDataFrame([("c1", 1)], "id STRING, n BIGINT").write.format("delta")
     .option("delta.enableChangeDataFeed", "true").option("delta.checkpointInterval", "2").save(str(path)))
    target = DeltaTable.forPath(spark, str(path))
    for batch in ([("c1", 2), ("c2", 1)], [("c3", 1), ("c4", 1)], [("c2", 5)]):
        (target.alias("t").merge(spark.createDataFrame(batch, "id STRING, n BIGINT").repartition(2).alias("s"),
                                 "t.id = s.id").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    target.delete("id = 'c3'")
    target.optimize().executeCompaction()
    target.update("id = 'c4'", {"n": "7"})
    storage = Backend.filesystem(path).storage()

    def compactor() -> Compactor:
        return Compactor("customers", str(path), storage, HoldRegistry(storage), threading.Lock(), spark,
                         CompactionSettings())

    carried = compactor()
    latest = DeltaTable.forPath(spark, str(path)).history(1).collect()[0]["version"]
    assert latest == 6
    for version in range(latest + 1):
        assert carried._snapshot_files(version) == carried._delta_snapshot_files(version), version
    # Below the frontier the log may be gone (compaction deletes it behind a checkpoint).
    for version in (0, 1):
        (path / "_delta_log" / f"{version:020d}.json").unlink()
    restarted = compactor()
    assert restarted._carried(frozenset(), -1, latest) is None
    assert restarted._snapshot_files(latest) == carried._snapshot_files(latest)


def test_the_compactions_optimize_merges_the_small_files_and_leaves_the_large_ones(
        spark: SparkSession, tmp_path: Path) -> None:
    """Delta's OPTIMIZE takes every file under 1 GiB, so a shared table below that was
    rewritten whole at each compaction; the compaction's takes those under its threshold."""
    from spark_app.runtime.tables.compaction import CompactionSettings, Compactor
    from spark_app.state.delta_log import TableLog
    from spark_app.state.tables import HoldRegistry

    path = tmp_path / "customers"
    spark.range(20_000).selectExpr("CAST(id AS STRING) AS id", "id AS n").coalesce(1).write.format("delta").save(
        str(path))
    for start in (20_000, 20_010, 20_020):
        spark.range(start, start + 10).selectExpr("CAST(id AS STRING) AS id", "id AS n").coalesce(1).write.format(
            "delta").mode("append").save(str(path))
    storage = Backend.filesystem(path).storage()
    log = TableLog(storage)
    large, = log.commit(0).adds
    small = log.commit(1).adds | log.commit(2).adds | log.commit(3).adds
    threshold = 16 * 1024  # between the two sizes
    assert (path / large).stat().st_size > threshold > max((path / f).stat().st_size for f in small)

    Compactor("customers", str(path), storage, HoldRegistry(storage), threading.Lock(), spark,
              CompactionSettings(merge_below_bytes=threshold))._optimize()
    optimized = log.commit(4)
    assert optimized.operation == "OPTIMIZE"
    assert optimized.removes == small and len(optimized.adds) == 1
    assert spark.read.format("delta").load(str(path)).count() == 20_030


def test_a_compaction_round_with_fewer_than_two_small_files_runs_no_spark_job(
        spark: SparkSession, tmp_path: Path) -> None:
    """Delta's OPTIMIZE merges only two files or more under the threshold, but rebuilds the
    snapshot with Spark jobs to find that out, holding the table's lock meanwhile; a round
    whose latest version has fewer runs no Spark job, and one with two OPTIMIZEs."""
    from spark_app.runtime.tables.compaction import CompactionSettings, Compactor, Round
    from spark_app.state.delta_log import TableLog
    from spark_app.state.tables import HoldRegistry

    path = tmp_path / "customers"

    def append(start: int, rows: int) -> None:
        spark.range(start, start + rows).selectExpr("CAST(id AS STRING) AS id", "id AS n").coalesce(1).write.format(
            "delta").mode("append").save(str(path))

    append(0, 20_000)
    append(20_000, 10)
    storage = Backend.filesystem(path).storage()
    log = TableLog(storage)
    compactor = Compactor("customers", str(path), storage, HoldRegistry(storage), threading.Lock(), spark,
                          CompactionSettings(merge_below_bytes=16 * 1024))
    context = spark.sparkContext

    def round_and_jobs(name: str) -> tuple[Round, int]:
        context.setJobGroup(name, "a compaction round")
        try:
            done = compactor.compact()
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        return done, len(context.statusTracker().getJobIdsForGroup(name))

    one_small, jobs = round_and_jobs("one-small-file")
    assert jobs == 0 and not one_small.optimized and log.latest() == 1
    append(20_010, 10)
    two_small, jobs = round_and_jobs("two-small-files")
    assert jobs > 0 and two_small.optimized
    assert log.commit(3).operation == "OPTIMIZE" and len(log.commit(3).adds) == 1
    merged, jobs = round_and_jobs("merged")
    assert jobs == 0 and not merged.optimized and log.latest() == 3
