"""PageRank over a growing graph of links, with a persistent fixed point.

Each CSV file under --links holds rows ``src,dst,diff`` (diff 1 adds a link, -1 removes
it). The step is a contraction (damping 0.85), so its fixed point is unique and reached
from any start: after new links the stored ranks are the starting point, and only rank
changes above the tolerance reach the output.

    python -m spark_app run examples/pagerank.py --links links/ --state state/
"""

import argparse

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import spark_app as sa

DAMPING = 0.85


def step(ranks: DataFrame, links: DataFrame, nodes: DataFrame) -> dict[str, DataFrame]:
    """rank(n) = (1 - d) + d * sum of rank(m) / outdegree(m) over the links m -> n."""
    degree = links.groupBy("src").agg(F.count("*").alias("degree"))
    shares = (ranks.join(links, ranks["node"] == links["src"]).join(degree, "src")
              .select(F.col("dst").alias("node"), (F.col("rank") / F.col("degree")).alias("share")))
    received = shares.groupBy("node").agg(F.sum("share").alias("share"))
    new_ranks = nodes.join(received, "node", "left").select(
        "node", (F.lit(1 - DAMPING) + F.lit(DAMPING) * F.coalesce("share", F.lit(0.0))).alias("rank"))
    return {"ranks": new_ranks}


def pagerank(links: DataFrame, tolerance: float = 1e-3, persistent_id: str = "pagerank") -> sa.IterateResult:
    endpoints = (links.select(F.col("src").alias("node"), "diff")
                 .unionByName(links.select(F.col("dst").alias("node"), "diff")))
    initial = endpoints.select("node", F.lit(1.0).alias("rank"), "diff")
    return sa.iterate(step, persistent_id=persistent_id, tolerance=tolerance, key={"ranks": ["node"]},
                      ranks=initial, links=links, nodes=endpoints)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--links", default="links/")
    parser.add_argument("--output", default="ranks.jsonlines")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    parser.add_argument("--state", default=None)
    parser.add_argument("--stop-when-idle", action="store_true")
    args = parser.parse_args()

    links = sa.io.csv.read(args.links, schema="src BIGINT, dst BIGINT, diff INT", persistent_id="links")
    sa.io.jsonlines.write(pagerank(links, args.tolerance).ranks, args.output)
    config = None
    if args.state:
        config = sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(args.state))
    sa.run(persistence_config=config, stop_when_idle=args.stop_when_idle)
