"""The iterate operator on real Spark: a warm-started fixed point equals a cold one.

The operator's sink is driven directly with batches of changes (as Spark's foreachBatch
would), on the real storage, engine and policy; the result is read back from the
changelog the output received.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from demo import story
from spark_app.persistence import Backend
from spark_app.runtime.iterate import store as iterate_store
from spark_app.runtime.iterate.engine import Convergence, fingerprint
from spark_app.runtime.iterate.node import IterateSink, IterateSpec
from spark_app.runtime.iterate.policy import Kind
from spark_app.runtime.iterate.store import IterateStore, TableRef
from spark_app.runtime.jvm.conf import spark_conf
from spark_app.runtime.jvm.session import build_session
from spark_app.runtime.sinks.base import Batch, OutputContext
from spark_app.runtime.sinks.jsonlines import JsonLinesOutput
from spark_app.state.records import QueryHead
from spark_app.storage import Storage
from tests.integration.spark_app.harness import REPO, fold, read_changelog


def context(storage: Storage, epoch: int = 1) -> OutputContext:
    """What a driver of ``epoch`` gives its sinks."""
    return OutputContext(epoch, "test-state", storage)


sys.path.insert(0, str(REPO / "examples"))
import connected_components as cc  # noqa: E402

pytestmark = pytest.mark.spark
EDGES = "u BIGINT, v BIGINT"
LABELS = "vertex BIGINT, label BIGINT, depth INT, parent BIGINT"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = build_session(spark_conf(Backend.filesystem("/tmp"), 10_000,
                                       {"spark.master": "local[2]", "spark.ui.enabled": "false"}))
    yield session


class Fed:
    """An iterate sink fed batch by batch, as its streaming query feeds it."""

    spark: SparkSession
    sink: IterateSink
    batch: int

    def feed(self, rows: list[tuple[str, str, int]]) -> dict[str, object]:
        """Writes and commits one batch of (table, row as JSON, diff); returns its commit's iterate record."""
        df = self.spark.createDataFrame(rows, "_table STRING, _row STRING, _diff INT")
        written = self.sink.write(Batch(self.batch, self.batch, df))
        self.sink.committed(written)
        self.batch += 1
        assert written.iterate is not None
        return written.iterate


class Components(Fed):
    """The connected-components iterate."""

    def __init__(self, spark: SparkSession, folder: Path, invalidate: bool = True, limit: int | None = None) -> None:
        self.spark, self.folder, self.batch = spark, folder, 0
        schemas = {name: spark.createDataFrame([], ddl).schema for name, ddl in (("edges", EDGES), ("labels", LABELS))}
        spec = IterateSpec(
            persistent_id="cc", step=cc.step,
            tables={name: spark.createDataFrame([], schema) for name, schema in schemas.items()},
            iterated=("labels",), schemas={**schemas, "result:labels": schemas["labels"]},
            kind=Kind.MONOTONE, limit=limit, convergence=Convergence(),
            invalidate=cc.invalidate if invalidate else None,
            fingerprint=fingerprint(cc.step, {"limit": limit}, {}), streaming=("edges", "labels"),
        )
        self.sink = IterateSink(spec, spark)
        self.output = JsonLinesOutput("labels", str(folder / "labels.jsonlines"), None)
        self.sink.attach("labels", self.output, ("vertex", "label"))
        self.storage = Backend.filesystem(folder / "state").storage()
        self.sink.recover(None, context(self.storage))

    def apply(self, changes: list[tuple[int, int, int]]) -> dict[str, object]:
        rows = []
        for u, v, diff in changes:
            rows.append(("edges", json.dumps({"u": u, "v": v}), diff))
            rows += [("labels", json.dumps({"vertex": x, "label": x, "depth": 0, "parent": x}), diff) for x in (u, v)]
        return self.feed(rows)

    def restart(self) -> None:
        """A new sink recovered from the last commit, as a relaunched driver makes one: it
        holds nothing in memory and reads the stored tables back."""
        head = QueryHead(batch=self.batch - 1, batch_time_ms=0, commit_time_ms=0, iterate=self.sink._committed.meta,
                         outputs={"labels": self.output._head})
        self.sink = IterateSink(self.sink.spec, self.spark)
        self.sink.attach("labels", self.output, ("vertex", "label"))
        self.epoch = getattr(self, "epoch", 1) + 1  # a relaunched driver has the next epoch
        self.sink.recover(head, context(self.storage, self.epoch))
        written = self.sink.start(0)
        assert written is not None and written.iterate is not None and written.iterate["decision"] == "reuse"
        self.sink.committed(written)

    def stored_edges(self) -> dict[str, int]:
        return self.sink._committed.meta["versions"]["contents"]["edges"]

    def labels(self) -> dict[int, int]:
        table = fold(read_changelog(self.folder / "labels.jsonlines"), ("vertex",))
        return {row["vertex"]: row["label"] for row in table.values()}


batches = st.lists(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7), st.booleans()), min_size=1, max_size=5),
                   min_size=2, max_size=4)


@settings(max_examples=int(os.environ.get("ITERATE_EXAMPLES", "5")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batches)
def test_after_every_batch_the_warm_result_equals_a_cold_computation(spark: SparkSession, tmp_path_factory,  # type: ignore[no-untyped-def]
                                                                    steps: list[list[tuple[int, int, bool]]]) -> None:
    components = Components(spark, tmp_path_factory.mktemp("cc"))
    live: dict[tuple[int, int], int] = {}
    for batch in steps:
        changes = []
        for u, v, delete in batch:
            if delete and live.get((u, v), 0) > 0:
                changes.append((u, v, -1))
                live[(u, v)] -= 1
            elif not delete:
                changes.append((u, v, 1))
                live[(u, v)] = live.get((u, v), 0) + 1
        if not changes:
            continue
        meta = components.apply(changes)
        assert meta["converged"]
        assert components.labels() == story.components(live), meta


def test_a_deletion_that_splits_a_component_is_rederived(spark: SparkSession, tmp_path: Path) -> None:
    components = Components(spark, tmp_path)
    assert components.apply([(1, 2, 1), (2, 3, 1), (3, 4, 1), (5, 6, 1)])["decision"] == "cold"
    meta = components.apply([(4, 5, 1)])
    assert (meta["decision"], components.labels()) == ("warm", {x: 1 for x in range(1, 7)})
    meta = components.apply([(2, 3, -1)])
    assert meta["decision"] == "partial"
    assert components.labels() == {1: 1, 2: 1, 3: 3, 4: 3, 5: 3, 6: 3}


def test_without_invalidate_a_deletion_recomputes_cold(spark: SparkSession, tmp_path: Path) -> None:
    components = Components(spark, tmp_path, invalidate=False)
    components.apply([(1, 2, 1), (2, 3, 1)])
    meta = components.apply([(1, 2, -1)])
    assert "no invalidate function" in meta["reason"] and meta["decision"] == "cold"
    assert components.labels() == {2: 2, 3: 2}


def test_a_result_cut_off_by_the_limit_is_not_trusted(spark: SparkSession, tmp_path: Path) -> None:
    components = Components(spark, tmp_path, limit=1)
    meta = components.apply([(1, 2, 1), (2, 3, 1), (3, 4, 1)])
    assert (meta["converged"], meta["iterations"]) == (False, 1)
    meta = components.apply([(5, 6, 1)])
    assert meta["decision"] == "cold" and "iteration limit" in meta["reason"]


def test_the_stored_inputs_are_a_snapshot_and_the_changes_since_which_a_restart_reads_back_exactly(
        spark: SparkSession, tmp_path: Path) -> None:
    components = Components(spark, tmp_path)
    live: dict[tuple[int, int], int] = {}

    def apply(changes: list[tuple[int, int, int]]) -> dict[str, int]:
        for u, v, diff in changes:
            live[(u, v)] = live.get((u, v), 0) + diff
        components.apply(changes)
        assert components.labels() == story.components(live)
        return components.stored_edges()

    # 20 distinct edges (a star around 1, converged in a few iterations) and 0-1 twice.
    first = apply([(0, 1, 1), (0, 1, 1)] + [(1, leaf, 1) for leaf in range(2, 21)])
    assert (first["rows"], first["logged"]) == (20, 0)
    # Small batches go to the log while it holds at most a quarter of the snapshot's rows.
    assert apply([(30, 31, 1), (31, 32, 1)]) == {**first, "logged": 2}
    components.restart()
    assert apply([(0, 1, -1), (1, 6, -1), (40, 41, 1)]) == {**first, "logged": 5}  # 0-1 stays, once
    # The restarted driver appended to a log segment of its own epoch: the old driver's is never touched.
    segments = components.sink._committed.meta["versions"]["inputs"]["edges"]
    assert [s["at"].split("/")[2][:7] for s in segments] == ["e000001", "e000002"]
    components.restart()
    # Then the next batch writes a new snapshot and empties the log; what it replaced is deleted.
    second = apply([(50, 51, 1), (51, 52, 1)])
    assert second["snapshot"] != first["snapshot"] and (second["rows"], second["logged"]) == (24, 0)
    stored = tmp_path / "state" / "iterate" / "cc"
    assert [p.name for p in (stored / "contents" / "edges").iterdir()] == [second["snapshot"]["at"].split("/")[2]]
    assert not (stored / "inputs" / "edges").exists() or not list((stored / "inputs" / "edges").iterdir())
    components.restart()
    apply([(0, 1, -1), (6, 7, 1)])  # the last 0-1 goes: 0 disappears
    assert 0 not in components.labels() and components.labels()[1] == 1


def test_a_restart_with_unchanged_input_runs_zero_iterations(spark: SparkSession, tmp_path: Path) -> None:
    first = Components(spark, tmp_path)
    first.apply([(1, 2, 1), (2, 3, 1)])
    head_meta = first.sink._committed.meta  # what the commit recorded
    restarted = Components.__new__(Components)
    restarted.__dict__.update(first.__dict__)
    restarted.sink = IterateSink(first.sink.spec, spark)
    restarted.sink.attach("labels", first.output, ("vertex", "label"))
    head = QueryHead(batch=0, batch_time_ms=0, commit_time_ms=0, iterate=head_meta,
                     outputs={"labels": first.output._head})
    restarted.sink.recover(head, context(first.storage, 2))
    written = restarted.sink.start(0)
    assert written is not None and written.iterate is not None
    assert (written.iterate["decision"], written.iterate["iterations"]) == ("reuse", 0)
    assert written.outputs == {}  # nothing emitted

    # An output added since gets the whole stored fixed point, still without iterating.
    restarted.sink.recover(QueryHead(batch=0, batch_time_ms=0, commit_time_ms=0, iterate=head_meta),
                          context(first.storage, 3))
    written = restarted.sink.start(0)
    assert written is not None and written.iterate["iterations"] == 0  # type: ignore[index]
    assert written.outputs["labels"].rows == 3


def test_each_stored_version_reads_the_same_as_its_parquet_files_and_through_delta(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store reads the files its commits name as plain Parquet, and a version with a
    longer log through Delta: the same rows at every version."""
    store = IterateStore(spark, Backend.filesystem(tmp_path).storage(), "cc", 1)
    schema = spark.createDataFrame([], EDGES).schema

    def changes(*rows: tuple[int, int, int]) -> DataFrame:
        return spark.createDataFrame(list(rows), "u BIGINT, v BIGINT, _diff INT")

    batches = [[(1, 2, 1)], [(2, 3, 1), (3, 4, 2)], [(1, 2, -1)]]
    log: list[TableRef] = []
    for batch in batches:
        log = store.append_changes("edges", changes(*batch), log)
    assert [ref.version for ref in log] == [2]
    for version in range(len(batches)):
        ref = TableRef(log[0].at, version)
        expected = sorted(row for batch in batches[:version + 1] for row in batch)
        assert store._parquet_files(ref) is not None
        assert sorted(map(tuple, store.read(ref, schema).collect())) == expected
        with monkeypatch.context() as patched:
            patched.setattr(iterate_store, "_PLAIN_READ_COMMITS", 0)  # as a log too long to replay
            assert store._parquet_files(ref) is None
            assert sorted(map(tuple, store.read(ref, schema).collect())) == expected


# ---- another monotone step: shortest paths, without a delta argument ----------------------

import shortest_paths  # noqa: E402


class Distances(Fed):
    """examples/shortest_paths.py from vertex 0, fed batch by batch; its step takes no delta."""

    def __init__(self, spark: SparkSession, folder: Path) -> None:
        self.spark, self.batch = spark, 0
        ddl = {"edges": "src BIGINT, dst BIGINT, weight DOUBLE", "distances": "node BIGINT, distance DOUBLE"}
        schemas = {name: spark.createDataFrame([], d).schema for name, d in ddl.items()}
        spec = IterateSpec(
            persistent_id="sp", step=shortest_paths.step,
            tables={name: spark.createDataFrame([], schema) for name, schema in schemas.items()},
            iterated=("distances",), schemas={**schemas, "result:distances": schemas["distances"]},
            kind=Kind.MONOTONE, limit=None, convergence=Convergence(), invalidate=None,
            fingerprint="sp", streaming=("edges", "distances"),
        )
        self.sink = IterateSink(spec, spark)
        self.sink.attach("distances", JsonLinesOutput("distances", str(folder / "distances.jsonlines"), None))
        self.sink.recover(None, context(Backend.filesystem(folder / "state").storage()))

    def apply(self, edges: list[tuple[int, int, float]]) -> dict[str, object]:
        rows = [("edges", json.dumps({"src": u, "dst": v, "weight": w}), 1) for u, v, w in edges]
        if self.batch == 0:
            rows.append(("distances", json.dumps({"node": 0, "distance": 0.0}), 1))
        return self.feed(rows)

    def distances(self) -> dict[int, float]:
        return {r["node"]: r["distance"] for r in self.sink._committed.result["distances"].collect()}


def bellman_ford(edges: list[tuple[int, int, float]]) -> dict[int, float]:
    distance = {0: 0.0}
    for _ in range(len(edges) + 1):
        for u, v, w in edges:
            if u in distance and distance[u] + w < distance.get(v, float("inf")):
                distance[v] = distance[u] + w
    return distance


weighted = st.lists(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(1, 5).map(float)),
                             min_size=1, max_size=6), min_size=2, max_size=3)


@settings(max_examples=int(os.environ.get("ITERATE_EXAMPLES", "5")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=weighted)
def test_shortest_paths_warm_start_on_inserted_edges_to_the_true_distances(  # type: ignore[no-untyped-def]
        spark: SparkSession, tmp_path_factory, batches: list[list[tuple[int, int, float]]]) -> None:
    paths = Distances(spark, tmp_path_factory.mktemp("sp"))
    seen: list[tuple[int, int, float]] = []
    for number, edges in enumerate(batches):
        seen += edges
        meta = paths.apply(edges)
        assert meta["decision"] == ("cold" if number == 0 else "warm"), meta
        assert paths.distances() == bellman_ford(seen), meta


# ---- a contraction: PageRank ------------------------------------------------------------

import pagerank  # noqa: E402

TOLERANCE = 1e-3
# Stopping when no rank moves by more than t leaves each result within t*d/(1-d) of the
# true fixed point (d = the damping), so a warm and a cold result differ by at most twice that.
BOUND = 2 * TOLERANCE * pagerank.DAMPING / (1 - pagerank.DAMPING)


class Ranks(Fed):
    def __init__(self, spark: SparkSession, folder: Path) -> None:
        self.spark, self.folder, self.batch = spark, folder, 0
        ddl = {"links": "src BIGINT, dst BIGINT", "nodes": "node BIGINT", "ranks": "node BIGINT, rank DOUBLE"}
        schemas = {name: spark.createDataFrame([], d).schema for name, d in ddl.items()}
        spec = IterateSpec(
            persistent_id="pr", step=pagerank.step,
            tables={name: spark.createDataFrame([], schema) for name, schema in schemas.items()},
            iterated=("ranks",), schemas={**schemas, "result:ranks": schemas["ranks"]},
            kind=Kind.CONTRACTION, limit=None, convergence=Convergence(TOLERANCE, {"ranks": ("node",)}),
            invalidate=None, fingerprint="pr", streaming=("links", "nodes", "ranks"),
        )
        self.sink = IterateSink(spec, spark)
        self.output = JsonLinesOutput("ranks", str(folder / "ranks.jsonlines"), None)
        self.sink.attach("ranks", self.output)
        self.sink.recover(None, context(Backend.filesystem(folder / "state").storage()))

    def apply(self, links: list[tuple[int, int, int]]) -> dict[str, object]:
        rows = []
        for src, dst, diff in links:
            rows.append(("links", json.dumps({"src": src, "dst": dst}), diff))
            for node in (src, dst):
                rows.append(("nodes", json.dumps({"node": node}), diff))
                rows.append(("ranks", json.dumps({"node": node, "rank": 1.0}), diff))
        return self.feed(rows)

    def emitted(self) -> dict[int, float]:
        return {r["node"]: r["rank"] for r in fold(read_changelog(self.folder / "ranks.jsonlines"), ("node",)).values()}

    def stored(self) -> dict[int, float]:
        return {r["node"]: r["rank"] for r in self.sink._committed.result["ranks"].collect()}


def test_a_contraction_warm_starts_and_matches_a_cold_run_within_the_tolerance(spark: SparkSession,
                                                                              tmp_path: Path) -> None:
    nodes = 30
    ring = [(i, (i + 1) % nodes, 1) for i in range(nodes)] + [(i, (i * 7) % nodes, 1) for i in range(0, nodes, 3)]
    growth = [(4, 17, 1), (0, 0, -1)]  # a small change: one link added, one removed
    warm = Ranks(spark, tmp_path / "warm")
    warm.apply(ring)
    meta = warm.apply(growth)
    assert meta["decision"] == "warm" and "contraction" in meta["reason"]

    cold = Ranks(spark, tmp_path / "cold")
    cold.apply(ring + growth)
    reference = cold.stored()
    assert set(warm.stored()) == set(reference)
    assert max(abs(warm.stored()[n] - reference[n]) for n in reference) <= BOUND
    # The outputs saw every change above the tolerance and none below it.
    assert max(abs(warm.emitted()[n] - warm.stored()[n]) for n in reference) <= TOLERANCE


def test_an_edge_inserted_and_deleted_in_one_batch_leaves_no_trace(spark: SparkSession, tmp_path: Path) -> None:
    components = Components(spark, tmp_path)
    components.apply([(0, 0, 1)])
    components.apply([(1, 0, 1), (1, 0, -1), (2, 3, 1)])
    assert components.labels() == {0: 0, 2: 2, 3: 2}
