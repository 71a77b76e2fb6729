"""Single-source shortest paths over a stream of weighted edge files.

Each CSV file under --edges holds ``src,dst,weight,diff``. Distances only ever decrease
as edges arrive, so the step is monotone and new edges warm-start from the stored
distances. A deleted edge can lengthen paths; no invalidate function is given here, so a
deletion recomputes from the stored inputs (cold): slower, never wrong.

    python -m spark_app run examples/shortest_paths.py --edges edges/ --source 1 --state state/
"""

import argparse

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import spark_app as sa


def step(distances: DataFrame, edges: DataFrame) -> dict[str, DataFrame]:
    """dist(v) = min(dist(v), dist(u) + w(u, v))."""
    relaxed = (distances.join(edges, distances["node"] == edges["src"])
               .select(F.col("dst").alias("node"), (F.col("distance") + F.col("weight")).alias("distance")))
    best = distances.unionByName(relaxed).groupBy("node").agg(F.min("distance").alias("distance"))
    return {"distances": best}


def shortest_paths(edges: DataFrame, source: DataFrame, persistent_id: str = "shortest_paths") -> sa.IterateResult:
    return sa.iterate(step, persistent_id=persistent_id, monotone=True, distances=source, edges=edges)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--edges", default="edges/")
    parser.add_argument("--source", type=int, default=1)
    parser.add_argument("--output", default="distances.jsonlines")
    parser.add_argument("--state", default=None)
    parser.add_argument("--stop-when-idle", action="store_true")
    args = parser.parse_args()

    edges = sa.io.csv.read(args.edges, schema="src BIGINT, dst BIGINT, weight DOUBLE, diff INT",
                           persistent_id="weighted_edges")
    spark = edges.sparkSession
    source = spark.createDataFrame([(args.source, 0.0)], "node BIGINT, distance DOUBLE")
    sa.io.jsonlines.write(shortest_paths(edges, source).distances, args.output)
    config = None
    if args.state:
        config = sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(args.state))
    sa.run(persistence_config=config, stop_when_idle=args.stop_when_idle)
