"""A driver's Java options, A against B, where a running pipeline feels them.

A start-up option (a class archive, compiler directives, a JIT setting) is measured by
`make bench-resume`; this measures what it costs once the driver is up. Alternated warm
drivers on one state of grouped counts (``--keys``), each with its option: 10 files to warm
up, then 40 files of 1,000 updates each, written one at a time at a random phase to the
pipeline's 200 ms trigger, each timed to its output line, then a backlog of 10 files of
50,000 updates timed to its last line. The driver gets the option as a user would, in
``spark.driver.extraJavaOptions``, after spark_app's own options. Reports each pair's
latency (median, mean, 90th percentile) and throughput, and B over A pair by pair.

    echo '[{"match": ["none/None.none"], "c2": {"Exclude": true}}]' > /tmp/none.json
    python bench/resume/java_options.py --a "directives=" \\
        --b "without=-XX:CompilerDirectivesFile=/tmp/none.json" --pairs 6

(the later ``-XX:CompilerDirectivesFile`` replaces spark_app's, and names no real method).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import SPARK_CONF, progress, stop_on_sigterm, write_results  # noqa: E402
from bench.resume.run import (  # noqa: E402
    Case,
    Tail,
    new_case,
    run_until_idle,
    start_driver,
    wait_for,
    write_history,
    write_marker,
    write_updates,
)

SMALL_FILES = 40
BACKLOG_FILES = 10


def one_driver(case: Case, label: str, options: str, keys: int, rng: random.Random) -> dict[str, Any]:
    """A warm driver's small files and backlog, with ``options`` as its extraJavaOptions."""
    conf = {**SPARK_CONF, **({"spark.driver.extraJavaOptions": options} if options else {})}
    log = case.log(f"driver-{label}")
    process = start_driver(case, log, conf=conf)
    try:
        tail = Tail(case.output)
        marker = write_marker(case)
        wait_for(lambda: tail.has(marker), process, log, 600)
        for _ in range(10):
            marker = write_updates(case, rng, keys, 999)
            wait_for(lambda m=marker: tail.has(m), process, log, 120)
        latencies = []
        for _ in range(SMALL_FILES):
            time.sleep(rng.uniform(0.2, 0.6))  # the file lands anywhere in a trigger's 200 ms
            began = time.monotonic()
            marker = write_updates(case, rng, keys, 999)
            wait_for(lambda m=marker: tail.has(m), process, log, 120)
            latencies.append(time.monotonic() - began)
        began = time.monotonic()
        for _ in range(BACKLOG_FILES):
            marker = write_updates(case, rng, keys, 49_999)
        wait_for(lambda: tail.has(marker), process, log, 1200)
        throughput = BACKLOG_FILES * 50_000 / (time.monotonic() - began)
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        process.wait(120)
    latencies.sort()
    return {"label": label, "latency_p50_s": round(statistics.median(latencies), 4),
            "latency_mean_s": round(statistics.mean(latencies), 4),
            "latency_p90_s": round(latencies[int(0.9 * len(latencies))], 4),
            "backlog_rows_per_s": round(throughput), "latencies_s": [round(x, 4) for x in latencies]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="LABEL=JAVA OPTIONS (empty: spark_app's own alone)")
    parser.add_argument("--b", required=True, help="LABEL=JAVA OPTIONS")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct keys of the state")
    parser.add_argument("--work", help="a folder to work in (default: a new temporary one, removed at the end)")
    args = parser.parse_args()
    stop_on_sigterm()
    (a_label, a_options), (b_label, b_options) = (v.split("=", 1) for v in (args.a, args.b))
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-java-options-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        case = new_case(work, "count", "count", "filesystem", None)
        progress(f"{args.keys:,} keys of state")
        write_history(case, args.keys, max(1, args.keys // 50_000))
        run_until_idle(case, "history")
        rng = random.Random(5)
        pairs = []
        for number in range(args.pairs):
            pair = [one_driver(case, f"{label}-{number}", options, args.keys, rng)
                    for label, options in ((a_label, a_options), (b_label, b_options))]
            pairs.append(pair)
            progress(f"pair {number + 1}/{args.pairs}: " + "; ".join(
                f"{run['label']} latency p50 {run['latency_p50_s']:.3f} s, mean {run['latency_mean_s']:.3f} s, "
                f"backlog {run['backlog_rows_per_s']:,} rows/s" for run in pair))
        summary = {}
        for key in ("latency_p50_s", "latency_mean_s", "latency_p90_s", "backlog_rows_per_s"):
            ratios = [b[key] / a[key] for a, b in pairs]
            summary[key] = {a_label: round(statistics.median(a[key] for a, _ in pairs), 4),
                            b_label: round(statistics.median(b[key] for _, b in pairs), 4),
                            f"{b_label}/{a_label} per pair, median": round(statistics.median(ratios), 3),
                            "per pair": [round(r, 3) for r in ratios]}
            progress(f"{key}: {summary[key]}")
        write_results("java-options", {"a": {"label": a_label, "options": a_options},
                                       "b": {"label": b_label, "options": b_options},
                                       "keys": args.keys, "pairs": pairs, "summary": summary})
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
