"""A reader's lookup of a shared table: a static DataFrame of the table's latest
committed version, which a stream joins against (the enrichment join).

How Spark and Delta resolve it, per micro-batch: the streaming query's plan keeps the
static Delta relation, and each batch is planned anew (IncrementalExecution); Delta's
PrepareDeltaScan rule, run while a plan is optimized, pins every scan of one table within
that plan to one snapshot, the latest at that moment (delta-io/delta,
stats/PrepareDeltaScan.scala, ``scannedSnapshots``). So a batch reads one version
throughout, and the next batch a newer one if the table moved. Planning happens before
the batch reaches foreachBatch, so spark_app cannot choose the version beforehand; it
reads the version the batch was planned with from the batch's executed plan (the scan's
``PreparedDeltaFileIndex``) and records it in the batch's commit. The reader's hold,
in place before the batch was planned, is at or below that version, so compaction
cannot take it away in the meantime.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import DataFrame, SparkSession


class LookupNotFound(Exception):
    """The batch's plan does not say which version of a lookup it read."""


def same_table(a: str, b: str) -> bool:
    """Whether two URIs (``file:/x``, ``file:///x``, ``s3a://bucket/x``) name one folder."""
    pa, pb = urlparse(a), urlparse(b)
    return (pa.netloc, pa.path.rstrip("/")) == (pb.netloc, pb.path.rstrip("/"))


def lookups_in(df: DataFrame, lookups: Mapping[str, str]) -> tuple[str, ...]:
    """The persistent ids of the lookups (persistent id -> table URI) a query's plan reads."""
    found: list[str] = []
    for node in _leaves(df._jdf.queryExecution().analyzed()):
        path = _delta_path(node) if node.getClass().getSimpleName() == "LogicalRelation" else None
        if path is not None:
            found.extend(pid for pid, uri in lookups.items() if same_table(uri, path) and pid not in found)
    return tuple(found)


def versions_read(spark: SparkSession, query_name: str, lookups: Mapping[str, str]) -> dict[str, int]:
    """The version of each lookup (persistent id -> table URI) that the batch running now
    in ``query_name`` was planned with. Called from the batch's foreachBatch, while the
    query's last execution is that batch's."""
    query = next((q for q in spark.streams.active if q.name == query_name), None)
    if query is None:
        raise LookupNotFound(f"query {query_name} is not running")
    plan = query._jsq.streamingQuery().lastExecution().executedPlan()
    if plan.nodeName() == "AdaptiveSparkPlan":
        plan = plan.inputPlan()
    versions: dict[str, int] = {}
    for node in _leaves(plan):
        if node.getClass().getSimpleName() != "FileSourceScanExec":
            continue
        scan = _delta_scan(node)
        if scan is None:
            continue
        path, version = scan
        for pid, uri in lookups.items():
            if same_table(uri, path):
                versions[pid] = min(version, versions.get(pid, version))
    missing = set(lookups) - set(versions)
    if missing:
        raise LookupNotFound(f"the plan of query {query_name}'s batch reads no version of lookup "
                             f"{', '.join(sorted(missing))}")
    return versions


def _leaves(node: Any) -> Iterator[Any]:
    children = node.children()
    if children.size() == 0:
        yield node
    for i in range(children.size()):
        yield from _leaves(children.apply(i))


def _delta_location(node: Any) -> Any:
    """The Delta file index of a file relation or scan (a TahoeFileIndex), or None. (Delta
    relations are anonymous subclasses of HadoopFsRelation: asked for their file index,
    other relations fail.)"""
    from py4j.protocol import Py4JError

    try:
        location = node.relation().location()
    except Py4JError:
        return None
    return location if location.getClass().getName().startswith("org.apache.spark.sql.delta.") else None


def _delta_path(node: Any) -> str | None:
    location = _delta_location(node)
    return None if location is None else str(location.path().toString())


def _delta_scan(node: Any) -> tuple[str, int] | None:
    location = _delta_location(node)
    return None if location is None else (str(location.path().toString()), int(location.version()))
