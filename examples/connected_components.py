"""Connected components over a stream of edge files, some of which delete edges.

Each CSV file under --edges holds rows ``u,v,diff``: diff 1 adds the undirected edge u-v,
diff -1 removes it. Every vertex is labelled with the smallest vertex id of its
component; the changelog at --output carries only labels that changed.

The iterated table keeps, for each vertex, its label and how it got it: the neighbour it
took the label from (``parent``) and its distance from the component's smallest vertex
along those choices (``depth``). The parents form a spanning forest, and that is what
makes deletions cheap:

* The step is monotone (a label only ever decreases), so inserted edges warm-start from
  the stored labels.
* A deleted edge that is not in the forest changes nothing. A deleted forest edge can
  only have been needed by the subtree below it: ``invalidate`` resets exactly that
  subtree, and the next iterations relabel it from its remaining neighbours (or, if the
  component split, from its own smallest vertex). A vertex whose edges are all gone is
  reset too, and disappears.

    python -m spark_app run examples/connected_components.py --edges edges/ --state state/
"""

import argparse
from collections.abc import Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import spark_app as sa

COLUMNS = ("vertex", "label", "depth", "parent")


def both_directions(edges: DataFrame) -> DataFrame:
    return edges.select("u", "v").unionByName(edges.select(F.col("v").alias("u"), F.col("u").alias("v")))


def step(labels: DataFrame, edges: DataFrame, delta: sa.Delta) -> dict[str, DataFrame]:
    """One round of min-label propagation, semi-naive: labels that changed in the last
    round travel along all edges, and all labels travel along newly inserted edges.

    A vertex keeps its row unless a neighbour offers a smaller label; it then takes the
    smallest offer, breaking ties by depth and neighbour id. Depth and parent change only
    with the label, so the parents never form a cycle."""
    offers = (delta.changed["labels"].join(both_directions(edges), F.col("vertex") == F.col("u"))
              .unionByName(labels.join(both_directions(delta.inserted["edges"]), F.col("vertex") == F.col("u")))
              .select(F.col("v").alias("vertex"), "label", (F.col("depth") + 1).alias("depth"),
                      F.col("u").alias("parent"), F.lit(1).alias("offer")))
    rows = labels.select(*COLUMNS, F.lit(0).alias("offer")).unionByName(offers)
    best = rows.groupBy("vertex").agg(F.min(F.struct("label", "offer", "depth", "parent")).alias("best"))
    return {"labels": best.select("vertex", "best.label", "best.depth", "best.parent")}


def invalidate(labels: DataFrame, deleted: Mapping[str, DataFrame], edges: DataFrame,
               **_: DataFrame) -> dict[str, DataFrame]:
    """The rows that may depend on deleted edges: the subtrees below deleted forest edges,
    and vertices left without any edge (with their subtrees)."""
    gone = deleted.get("edges")
    if gone is None:
        return {}
    gone_both = both_directions(gone)
    cut = (labels.join(gone_both, (F.col("parent") == F.col("u")) & (F.col("vertex") == F.col("v")))
           .select("vertex"))
    touched = gone_both.select(F.col("u").alias("vertex")).distinct()
    isolated = touched.join(both_directions(edges).select(F.col("u").alias("vertex")), "vertex", "left_anti")
    reset = cut.unionByName(isolated).distinct().localCheckpoint(eager=True)
    frontier = reset
    while not frontier.isEmpty():
        children = (labels.join(frontier.select(F.col("vertex").alias("parent")), "parent")
                    .where(F.col("vertex") != F.col("parent")).select("vertex")
                    .subtract(reset).localCheckpoint(eager=True))
        reset = reset.unionByName(children).localCheckpoint(eager=True)
        frontier = children
    return {"labels": labels.join(reset, "vertex").select(*COLUMNS)}


def components(edges: DataFrame, persistent_id: str = "components") -> sa.IterateResult:
    """Labels (vertex, label, depth, parent) of the vertices of ``edges`` (u, v, diff)."""
    def own(column: str) -> DataFrame:
        vertex = F.col(column)
        return edges.select(vertex.alias("vertex"), vertex.alias("label"), F.lit(0).cast("int").alias("depth"),
                            vertex.alias("parent"), "diff")

    return sa.iterate(step, persistent_id=persistent_id, monotone=True, invalidate=invalidate,
                      labels=own("u").unionByName(own("v")), edges=edges)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--edges", default="edges/")
    parser.add_argument("--output", default="components.jsonlines")
    parser.add_argument("--state", default=None)
    parser.add_argument("--stop-when-idle", action="store_true")
    args = parser.parse_args()

    edges = sa.io.csv.read(args.edges, schema="u BIGINT, v BIGINT, diff INT", persistent_id="edges")
    sa.io.jsonlines.write(components(edges).labels.select("vertex", "label"), args.output)
    config = None
    if args.state:
        config = sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(args.state))
    sa.run(persistence_config=config, stop_when_idle=args.stop_when_idle)
