"""A shared table's compaction round on a large table: the OPTIMIZE that merges only the
files under the compaction's threshold (64 MiB, CompactionSettings.merge_below_bytes)
against Delta's own threshold (1 GiB), which takes every file of a table below it.

The table: --rows rows in one file (about 46 bytes a row), then --appends small files of
1,000 rows, as a publisher's batches leave them. Each round copies it twice and runs one
OPTIMIZE on each copy, in one driver, the order alternating, after a round of each that
is not counted (the JVM's first OPTIMIZE compiles its code); the result is the seconds of
each and their ratio per round.

    .venv/bin/python bench/shared/optimize.py [--rows 4000000 --appends 4 --rounds 4]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import SparkSession  # noqa: E402

from bench.common import progress, write_results  # noqa: E402
from spark_app.persistence import Backend  # noqa: E402
from spark_app.runtime.jvm.conf import spark_conf  # noqa: E402
from spark_app.runtime.jvm.session import build_session  # noqa: E402
from spark_app.runtime.tables.compaction import CompactionSettings, Compactor  # noqa: E402
from spark_app.state.tables import HoldRegistry  # noqa: E402

VARIANTS = {"threshold_64MiB": CompactionSettings(), "delta_1GiB": CompactionSettings(merge_below_bytes=2**30)}


def write_table(spark: SparkSession, path: Path, rows: int, appends: int) -> None:
    """A table as a publisher's compactions find it: ``rows`` rows in one file (about 46
    bytes a row), then ``appends`` small files of 1,000 rows."""
    columns = "uuid() AS customer_id", "id AS orders", "rand() AS total"
    (spark.range(rows).selectExpr(*columns).repartition(1).write.format("delta")
     .option("delta.enableChangeDataFeed", "true").save(str(path)))
    for append in range(appends):
        first = rows + 1000 * append
        spark.range(first, first + 1000).selectExpr(*columns).coalesce(1).write.format("delta").mode(
            "append").save(str(path))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--appends", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    options = parser.parse_args()
    spark = build_session(spark_conf(Backend.filesystem("/tmp"), 10_000, {"spark.ui.enabled": "false"}))
    work = Path(tempfile.mkdtemp(prefix="bench-optimize-"))
    try:
        base = work / "base"
        write_table(spark, base, options.rows, options.appends)
        table_bytes = sum(f.stat().st_size for f in base.glob("*.parquet"))
        progress(f"table of {table_bytes:,} bytes: one file of {options.rows:,} rows and {options.appends} small ones")
        seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for number in range(-1, options.rounds):  # round -1: the warm-up
            order = list(VARIANTS) if number % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                copy = work / f"{number}-{name}"
                shutil.copytree(base, copy)
                storage = Backend.filesystem(copy).storage()
                compactor = Compactor("bench", str(copy), storage, HoldRegistry(storage), threading.Lock(), spark,
                                      VARIANTS[name])
                began = time.monotonic()
                compactor._optimize()
                took = round(time.monotonic() - began, 2)
                shutil.rmtree(copy)
                if number >= 0:
                    seconds[name].append(took)
                progress(f"round {number + 1}{' (warm-up)' if number < 0 else ''}: {name} {took} s")
        ratios = [round(a / b, 3) for a, b in zip(seconds["threshold_64MiB"], seconds["delta_1GiB"], strict=True)]
        write_results("shared-optimize", {
            "rows": options.rows, "appends": options.appends, "table_bytes": table_bytes, "seconds": seconds,
            "ratio_threshold_over_delta": {"median": statistics.median(ratios), "min": min(ratios),
                                           "max": max(ratios), "all": ratios}})
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
