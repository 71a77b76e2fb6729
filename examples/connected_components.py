"""Connected components over a stream of edge files, some of which delete edges.

Each CSV file under --edges holds rows ``u,v,diff``: diff 1 adds the undirected edge u-v,
diff -1 removes it. Every vertex is labelled with the smallest vertex id of its
component; the changelog at --output carries only labels that changed.

The step is monotone (labels only ever decrease), so insertions warm-start from the
stored labels. A deletion can split a component: ``invalidate`` resets the old
components of the touched vertices and re-iterates only those (delete and rederive).

    python -m spark_app run examples/connected_components.py --edges edges/ --state state/
"""

import argparse

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import spark_app as sa


def both_directions(edges: DataFrame) -> DataFrame:
    return edges.select("u", "v").unionByName(edges.select(F.col("v").alias("u"), F.col("u").alias("v")))


def step(labels: DataFrame, edges: DataFrame, delta: sa.Delta) -> dict[str, DataFrame]:
    """One round of min-label propagation, semi-naive: only labels that changed in the last
    round travel along all edges, and all labels travel along newly inserted edges."""
    moved = delta.changed["labels"].join(both_directions(edges), F.col("vertex") == F.col("u"))
    crossed = labels.join(both_directions(delta.inserted["edges"]), F.col("vertex") == F.col("u"))
    candidates = moved.unionByName(crossed).select(F.col("v").alias("vertex"), "label")
    best = labels.unionByName(candidates).groupBy("vertex").agg(F.min("label").alias("label"))
    return {"labels": best}


def invalidate(labels: DataFrame, deleted: dict[str, DataFrame], **_: DataFrame) -> dict[str, DataFrame]:
    """The labels that may depend on deleted edges: whole old components of their endpoints."""
    gone = deleted.get("edges")
    if gone is None:
        return {}
    touched = gone.select(F.col("u").alias("vertex")).unionByName(gone.select(F.col("v").alias("vertex")))
    stale = labels.join(touched, "vertex").select("label").distinct()
    return {"labels": labels.join(stale, "label").select("vertex", "label")}


def components(edges: DataFrame, persistent_id: str = "components") -> sa.IterateResult:
    vertices = (edges.select(F.col("u").alias("vertex"), F.col("u").alias("label"), "diff")
                .unionByName(edges.select(F.col("v").alias("vertex"), F.col("v").alias("label"), "diff")))
    return sa.iterate(step, persistent_id=persistent_id, monotone=True, invalidate=invalidate,
                      labels=vertices, edges=edges)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--edges", default="edges/")
    parser.add_argument("--output", default="components.jsonlines")
    parser.add_argument("--state", default=None)
    parser.add_argument("--stop-when-idle", action="store_true")
    args = parser.parse_args()

    edges = sa.io.csv.read(args.edges, schema="u BIGINT, v BIGINT, diff INT", persistent_id="edges")
    sa.io.jsonlines.write(components(edges).labels, args.output)
    config = None
    if args.state:
        config = sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(args.state))
    sa.run(persistence_config=config, stop_when_idle=args.stop_when_idle)
