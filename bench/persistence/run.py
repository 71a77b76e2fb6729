"""`make bench-persistence`: what persistence costs and what resuming saves.

1. Overhead: the word count over 1M rows through spark_app (source index, dead-letter
   checks, one commit per batch, an exactly-once changelog) versus the same query written
   directly in Structured Streaming with a checkpoint, also run with spark_app's start-up
   aids (the workers' Python launcher and the JVM's class archive) for comparison. All run
   in fresh processes, in alternation, ROUNDS times; medians and their ratios are reported.
2. Resume versus recompute: after N rows are processed (N = 1M, 2M, 4M), a new file
   arrives. The time from the driver's start to the new file's first output line, when
   the driver resumes from its state, versus a driver that recomputes everything from
   empty state. Reported per N, with the ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import REPO, SPARK_CONF, progress, run_process, spark_app, start_up_conf, write_results  # noqa: E402
from spark_app.runtime.jvm.worker_python import worker_python  # noqa: E402

ROWS_PER_FILE = 50_000
# The baseline runs as a user would write it, and once more with what spark_app does to
# start a driver sooner (spark_app.runtime.jvm.worker_python, the Python launcher of Spark's
# workers, and spark_app.runtime.jvm.class_archive, the JVM's class archive), so that the report
# separates those from the cost of persistence itself.
RUNNERS = ("spark_app", "baseline", "baseline_with_start_up_aids")
VOCABULARY = 20_000


def write_files(folder: Path, first: int, count: int, seed: int = 7) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + first)
    words = [f"w{i}" for i in range(VOCABULARY)]
    weights = [1 / (i + 1) for i in range(VOCABULARY)]  # Zipf-like, as words in text are
    for number in range(first, first + count):
        chosen = rng.choices(words, weights, k=ROWS_PER_FILE)
        temp = folder / f".part-{number:04d}.csv.tmp"
        temp.write_text("word\n" + "\n".join(chosen) + "\n")
        temp.rename(folder / f"part-{number:04d}.csv")


def write_marker(folder: Path, name: str) -> str:
    word = f"marker_{name}"
    (folder / f".{name}.tmp").write_text(f"word\n{word}\n")
    (folder / f".{name}.tmp").rename(folder / f"{name}.csv")
    return word


def spark_app_wordcount(work: Path, inputs: Path, state: Path, output: Path, log: str, until=None):  # type: ignore[no-untyped-def]
    args = spark_app("examples/wordcount.py", "--input", str(inputs), "--output", str(output),
                     "--state", str(state), "--trigger-interval-ms", "200", "--snapshot-interval-ms", "10000")
    if until is None:
        args.append("--stop-when-idle")
    return run_process(args, work / log, until=until)


def overhead(work: Path, rows: int, rounds: int) -> dict[str, object]:
    inputs = work / "overhead-inputs"
    write_files(inputs, 0, rows // ROWS_PER_FILE)
    conf = start_up_conf()
    archive = conf["spark.driver.defaultJavaOptions"]
    aids = {"PYSPARK_PYTHON": worker_python(), "PYSPARK_DRIVER_PYTHON": worker_python(),
            "SPARK_APP_SPARK_CONF": json.dumps({**SPARK_CONF, **conf})}
    seconds: dict[str, list[float]] = {name: [] for name in RUNNERS}
    for round_number in range(rounds):
        for name in RUNNERS:
            folder = work / f"overhead-{name}-{round_number}"
            folder.mkdir()
            if name == "spark_app":
                run = spark_app_wordcount(folder, inputs, folder / "state", folder / "out.jsonlines", "driver.log")
            else:
                run = run_process([sys.executable, str(REPO / "bench/persistence/baseline_wordcount.py"),
                                   "--input", str(inputs), "--output", str(folder / "out.jsonlines"),
                                   "--checkpoint", str(folder / "checkpoint")], folder / "driver.log",
                                  env=aids if name == "baseline_with_start_up_aids" else None)
            if run.returncode != 0:
                raise SystemExit(f"{name} failed; see {folder / 'driver.log'}")
            counted = _counted_words(folder / "out.jsonlines", changelog=name == "spark_app")
            if counted != rows:
                raise SystemExit(f"{name} counted {counted:,} words of {rows:,}; see {folder}")
            seconds[name].append(run.seconds)
            progress(f"overhead round {round_number + 1}/{rounds}: {name} {run.seconds:.1f}s")
    median = {name: statistics.median(values) for name, values in seconds.items()}
    ratio = median["spark_app"] / median["baseline"]
    progress(f"overhead: spark_app {median['spark_app']:.1f}s vs Structured Streaming {median['baseline']:.1f}s, "
             f"ratio {ratio:.2f} (with spark_app's start-up aids: {median['baseline_with_start_up_aids']:.1f}s)")
    return {"rows": rows, "spark_app_seconds": seconds["spark_app"],
            "structured_streaming_seconds": seconds["baseline"],
            "structured_streaming_with_start_up_aids_seconds": seconds["baseline_with_start_up_aids"],
            "class_archive": archive or None,
            "median_ratio": round(ratio, 3),
            "median_ratio_to_baseline_with_start_up_aids":
                round(median["spark_app"] / median["baseline_with_start_up_aids"], 3),
            "goal": "ratio <= 1.10"}


def resume_versus_recompute(work: Path, sizes: list[int]) -> list[dict[str, object]]:
    inputs, state, output = work / "history", work / "history-state", work / "history.jsonlines"
    results, files_done = [], 0
    for rows in sizes:
        files = rows // ROWS_PER_FILE
        write_files(inputs, files_done, files - files_done)
        files_done = files
        progress(f"resume vs recompute at {rows:,} rows: processing the history")
        history = spark_app_wordcount(work, inputs, state, output, f"history-{rows}.log")
        if history.returncode != 0:
            raise SystemExit(f"history run failed; see {work}/history-{rows}.log")
        marker = write_marker(inputs, f"new-{rows}")
        resumed = spark_app_wordcount(work, inputs, state, output, f"resume-{rows}.log",
                                      until=lambda m=marker, o=output: _has(o, m))
        progress(f"  resumed to the new file's output in {resumed.seconds:.1f}s")
        fresh = work / f"recompute-{rows}"
        recomputed = spark_app_wordcount(work, inputs, fresh, work / f"recompute-{rows}.jsonlines",
                                         f"recompute-{rows}.log",
                                         until=lambda m=marker, o=work / f"recompute-{rows}.jsonlines": _has(o, m))
        shutil.rmtree(fresh, ignore_errors=True)
        ratio = resumed.seconds / recomputed.seconds
        progress(f"  recomputed from scratch to the same output in {recomputed.seconds:.1f}s: ratio {ratio:.2f}")
        results.append({"history_rows": rows, "resume_seconds": resumed.seconds,
                        "recompute_seconds": recomputed.seconds, "ratio": round(ratio, 3)})
    return results


def _counted_words(path: Path, changelog: bool) -> int:
    """The sum of the final counts: from spark_app's changelog (rows with diff), or from the
    baseline's update-mode rows (the last row of each word holds its count)."""
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if not changelog or row["diff"] > 0:
            counts[row["word"]] = row["count"]
        elif counts.get(row["word"]) == row["count"]:
            del counts[row["word"]]
    return sum(counts.values())


def _has(path: Path, word: str) -> bool:
    try:
        return f'"{word}"' in path.read_text()
    except FileNotFoundError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows for the overhead comparison")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="1000000,2000000,4000000", help="history sizes for resume vs recompute (empty: skip)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-persistence-"))
    progress(f"working in {work}")
    try:
        results = {
            "overhead": overhead(work, args.rows, args.rounds),
            "resume_versus_recompute": resume_versus_recompute(work, [int(s) for s in args.sizes.split(",") if s]),
            "notes": "times are wall-clock from process start, including JVM start-up, on a shared 2-core machine",
        }
        write_results("persistence", results)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
