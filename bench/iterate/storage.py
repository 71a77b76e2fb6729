"""How much an iterate operator stores over a long run: connected components fed one small
batch at a time (a few edges inserted, now and then one deleted), with the bytes under its
folder measured as it goes. Each commit names the tables of the committed state, and
superseded ones are deleted, so storage should follow the state's size, not the number of
batches.

    .venv/bin/python bench/iterate/storage.py [--batches 200] [--every 25]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import connected_components as cc  # noqa: E402

from bench.common import SPARK_CONF, progress, write_results  # noqa: E402
from spark_app.persistence import Backend  # noqa: E402
from spark_app.runtime.iterate.engine import Convergence, fingerprint  # noqa: E402
from spark_app.runtime.iterate.node import IterateSink, IterateSpec  # noqa: E402
from spark_app.runtime.iterate.policy import Kind  # noqa: E402
from spark_app.runtime.jvm.conf import spark_conf  # noqa: E402
from spark_app.runtime.jvm.session import build_session  # noqa: E402
from spark_app.runtime.sinks.base import Batch, OutputContext  # noqa: E402
from spark_app.runtime.sinks.jsonlines import JsonLinesOutput  # noqa: E402

EDGES = "u BIGINT, v BIGINT"
LABELS = "vertex BIGINT, label BIGINT, depth INT, parent BIGINT"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--every", type=int, default=25, help="measure every this many batches")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-iterate-storage-"))
    spark = build_session(spark_conf(Backend.filesystem(folder), 10_000, {**SPARK_CONF, "spark.driver.memory": "2g"}))
    schemas = {name: spark.createDataFrame([], ddl).schema for name, ddl in (("edges", EDGES), ("labels", LABELS))}
    spec = IterateSpec(
        persistent_id="cc", step=cc.step, tables={n: spark.createDataFrame([], s) for n, s in schemas.items()},
        iterated=("labels",), schemas={**schemas, "result:labels": schemas["labels"]}, kind=Kind.MONOTONE,
        limit=None, convergence=Convergence(), invalidate=cc.invalidate,
        fingerprint=fingerprint(cc.step, {}, {}), streaming=("edges", "labels"))
    storage = Backend.filesystem(folder / "state").storage()
    sink = IterateSink(spec, spark)
    sink.attach("labels", JsonLinesOutput("labels", str(folder / "labels.jsonlines"), None), ("vertex", "label"))
    sink.recover(None, OutputContext(1, "bench", storage))
    chance, live, samples = random.Random(7), [], []
    began = time.monotonic()
    for batch in range(options.batches):
        changes = [(chance.randrange(2000), chance.randrange(2000), 1) for _ in range(5)]
        if live and batch % 10 == 9:
            changes.append((*live.pop(chance.randrange(len(live))), -1))
        live += [(u, v) for u, v, d in changes if d > 0]
        rows = []
        for u, v, diff in changes:
            rows.append(("edges", json.dumps({"u": u, "v": v}), diff))
            rows += [("labels", json.dumps({"vertex": x, "label": x, "depth": 0, "parent": x}), diff) for x in (u, v)]
        written = sink.write(Batch(batch, batch, spark.createDataFrame(rows, "_table STRING, _row STRING, _diff INT")))
        sink.committed(written)
        if (batch + 1) % options.every == 0:
            stored = storage.size("iterate/")
            tables = len({"/".join(k.split("/")[:5]) for k in storage.list("iterate/")})
            samples.append({"batches": batch + 1, "edges": len(live), "iterate_bytes": stored, "tables": tables,
                            "seconds": round(time.monotonic() - began, 1)})
            progress(f"after {batch + 1} batches ({len(live)} edges): {stored / 1024:.0f} KiB in {tables} tables")
    write_results("iterate-storage", {"batches": options.batches, "samples": samples})


if __name__ == "__main__":
    main()
