"""A shared table's compaction round when the latest version has nothing to merge (one
file under the threshold beside a large one, as after an OPTIMIZE and one batch, or a
publisher idling between its timed rounds): the round as it is, which skips OPTIMIZE,
against the round that always ran it (Delta then rebuilds the snapshot with Spark jobs
only to merge nothing, holding the table's lock).

The table: --rows rows in one file (about 46 bytes a row: over the 64-MiB threshold at
the default), then one small file of 1,000 rows. Each round runs
one compaction round of each variant on it (a round that merges nothing changes nothing,
so both read the same table), in one driver, the order alternating, after a round of
each that is not counted. Reported per variant: the seconds of each round and the
driver's CPU seconds (Python and its JVM) during it, and the ratios per round.

    .venv/bin/python bench/shared/idle_round.py [--rows 2000000 --rounds 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import process_cpu_seconds, progress, write_results  # noqa: E402
from bench.shared.optimize import write_table  # noqa: E402
from spark_app.persistence import Backend  # noqa: E402
from spark_app.runtime.jvm.conf import spark_conf  # noqa: E402
from spark_app.runtime.jvm.session import build_session  # noqa: E402
from spark_app.runtime.tables.compaction import CompactionSettings, Compactor  # noqa: E402
from spark_app.state.tables import HoldRegistry  # noqa: E402
from spark_app.storage import FileEntry  # noqa: E402


class AlwaysOptimizing(Compactor):
    """The round before it looked: OPTIMIZE whatever the table holds."""

    def _mergeable(self, latest: int, entries: list[FileEntry]) -> int | None:
        return None


def driver_cpu_seconds() -> float:
    """This process's CPU and its children's (the JVM the session started), so far."""
    pids = [os.getpid(), *(int(p) for p in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text()
                           .split())]
    return sum(process_cpu_seconds(pid) for pid in pids)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=6)
    options = parser.parse_args()
    spark = build_session(spark_conf(Backend.filesystem("/tmp"), 10_000, {"spark.ui.enabled": "false"}))
    work = Path(tempfile.mkdtemp(prefix="bench-idle-round-"))
    try:
        table = work / "table"
        write_table(spark, table, options.rows, appends=1)
        storage = Backend.filesystem(table).storage()
        settings = CompactionSettings(margin_s=0)
        variants = {kind.__name__: kind("bench", str(table), storage, HoldRegistry(storage), threading.Lock(), spark,
                                        settings) for kind in (Compactor, AlwaysOptimizing)}
        sizes = sorted(f.stat().st_size for f in table.glob("*.parquet"))
        progress(f"table: files of {', '.join(f'{size:,}' for size in sizes)} bytes "
                 f"(threshold {settings.merge_below_bytes:,})")
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        for number in range(-1, options.rounds):  # round -1: the warm-up
            order = list(variants) if number % 2 == 0 else list(reversed(variants))
            for name in order:
                cpu_before, began = driver_cpu_seconds(), time.monotonic()
                done = variants[name].compact()
                took, used = round(time.monotonic() - began, 3), round(driver_cpu_seconds() - cpu_before, 2)
                if number >= 0:
                    seconds[name].append(took)
                    cpu[name].append(used)
                progress(f"round {number + 1}{' (warm-up)' if number < 0 else ''}: {name} {took} s, {used} CPU s, "
                         f"optimized: {done.optimized}, latest version {done.latest}")

        def ratios(values: dict[str, list[float]]) -> dict[str, object]:
            each = [round(a / b, 3) for a, b in zip(values["Compactor"], values["AlwaysOptimizing"], strict=True)]
            return {"median": statistics.median(each), "min": min(each), "max": max(each), "all": each}

        write_results("shared-idle-round", {
            "rows": options.rows, "file_bytes": sizes, "seconds": seconds, "cpu_seconds": cpu,
            "ratio_seconds_skipping_over_always": ratios(seconds), "ratio_cpu_skipping_over_always": ratios(cpu)})
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
