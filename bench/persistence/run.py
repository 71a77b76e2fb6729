"""`make bench-persistence`: what persistence costs a running pipeline.

The word count of examples/wordcount.py (a Zipf-like vocabulary of 20,000 words) through
spark_app, beside the same query written directly in Structured Streaming
(bench/persistence/baseline_wordcount.py: a checkpoint, the RocksDB state store with
changelog checkpointing, update-mode rows appended to a JSON-lines file) and given
spark_app's start-up aids (its jars on the class path, the JVM's class archive, the
workers' Python launcher), so that what differs is persistence's own cost:

1. start: a driver started on the state of a one-file history, with one new file of 100
   rows: from the process's start to that file's first output line. What every restart
   pays again.
2. latency: a running driver (a trigger every 200 ms) gets one file of 100 rows every
   2 s: from each file's arrival to its first output line, in a warm driver.
3. throughput: the word count from empty state over a backlog of ``--rows`` rows and of an
   eighth of that; the difference of rows over the difference of times, so that the
   start cancels out: rows a second once running.

The two run in alternation, ``--rounds`` times; each figure is reported with the
median of each side, their ratio and the spread of the per-round ratios. Resume at large
state is `make bench-resume`. Results: bench/results/persistence-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import REPO, SPARK_CONF, progress, run_process, spark_app, start_up_conf, write_results  # noqa: E402
from bench.resume.run import Tail  # noqa: E402
from spark_app.runtime.jvm.worker_python import worker_python  # noqa: E402

ROWS_PER_FILE = 50_000
VOCABULARY = 20_000
SMALL_FILE_ROWS = 100
SMALL_SHARE = 8
"""The smaller backlog is this share of the larger: their difference is what is timed."""
TRIGGER_MS = "200"


# ---- input ----------------------------------------------------------------------------------

def write_files(folder: Path, first: int, count: int, seed: int = 7) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + first)
    words = [f"w{i}" for i in range(VOCABULARY)]
    weights = [1 / (i + 1) for i in range(VOCABULARY)]  # Zipf-like, as words in text are
    for number in range(first, first + count):
        _arrive(folder, f"part-{number:04d}.csv", "word\n" + "\n".join(rng.choices(words, weights, k=ROWS_PER_FILE)) + "\n")


def write_small_file(folder: Path, rng: random.Random) -> str:
    """One file of 100 rows, one of them a word never seen before: its output line says the
    file was processed."""
    marker = f"new_{uuid.uuid4().hex[:10]}"
    rows = [f"w{rng.randrange(VOCABULARY)}" for _ in range(SMALL_FILE_ROWS - 1)] + [marker]
    _arrive(folder, f"small-{marker}.csv", "word\n" + "\n".join(rows) + "\n")
    return marker


def _arrive(folder: Path, name: str, text: str) -> None:
    temporary = folder / f".{name}.tmp"
    temporary.write_text(text)
    temporary.rename(folder / name)


# ---- the two runners ------------------------------------------------------------------------

@dataclass(frozen=True)
class Runner:
    name: str
    command: Callable[[Path, Path, Path, bool], list[str]]
    """(inputs, output, state, stop when idle) -> the driver's command line."""
    env: dict[str, str]


def _spark_app(inputs: Path, output: Path, state: Path, stop_when_idle: bool) -> list[str]:
    args = spark_app("examples/wordcount.py", "--input", str(inputs), "--output", str(output), "--state", str(state),
                     "--trigger-interval-ms", TRIGGER_MS, "--snapshot-interval-ms", "10000")
    return args + (["--stop-when-idle"] if stop_when_idle else [])


def _baseline(inputs: Path, output: Path, state: Path, stop_when_idle: bool) -> list[str]:
    args = [sys.executable, str(REPO / "bench/persistence/baseline_wordcount.py"), "--input", str(inputs),
            "--output", str(output), "--checkpoint", str(state), "--trigger-interval-ms", TRIGGER_MS]
    return args + (["--stop-when-idle"] if stop_when_idle else [])


def runners() -> list[Runner]:
    aids = {"PYSPARK_PYTHON": worker_python(), "PYSPARK_DRIVER_PYTHON": worker_python(),
            "SPARK_APP_SPARK_CONF": json.dumps({**SPARK_CONF, **start_up_conf()})}
    return [Runner("spark_app", _spark_app, {}), Runner("structured_streaming", _baseline, aids)]


# ---- the three measurements -----------------------------------------------------------------

def start_cost(work: Path, runner: Runner, rng: random.Random) -> float:
    """Seconds from a driver's start, on a one-file history's state, to a new file's output."""
    folder = work / f"start-{runner.name}-{uuid.uuid4().hex[:6]}"
    inputs, output, state = folder / "inputs", folder / "out.jsonlines", folder / "state"
    write_files(inputs, 0, 1)
    history = run_process(runner.command(inputs, output, state, True), folder / "history.log", env=runner.env)
    if history.returncode != 0:
        raise SystemExit(f"{runner.name}: the history run failed; see {folder}/history.log")
    marker = write_small_file(inputs, rng)
    tail = Tail(output)
    run = run_process(runner.command(inputs, output, state, False), folder / "start.log", env=runner.env,
                      until=lambda: tail.has(marker))
    if not tail.has(marker) and marker not in output.read_text():
        raise SystemExit(f"{runner.name}: stopped before the new file's output; see {folder}/start.log")
    shutil.rmtree(folder / "inputs")
    return run.seconds


def batch_latencies(work: Path, runner: Runner, files: int, rng: random.Random) -> list[float]:
    """Seconds from each small file's arrival to its output, in a running driver."""
    folder = work / f"latency-{runner.name}-{uuid.uuid4().hex[:6]}"
    inputs, output, state = folder / "inputs", folder / "out.jsonlines", folder / "state"
    inputs.mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPARK_APP_SPARK_CONF": json.dumps(SPARK_CONF),
           **runner.env}
    with open(folder / "driver.log", "wb") as log:
        process = subprocess.Popen(runner.command(inputs, output, state, False), cwd=REPO, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        tail = Tail(output)
        latencies = []
        for number in range(files + 2):  # the first two warm the driver up and are not counted
            marker = write_small_file(inputs, rng)
            began = time.monotonic()
            deadline = began + 300
            while not tail.has(marker):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{runner.name}: no output for {marker}; see {folder}/driver.log")
                time.sleep(0.01)
            if number >= 2:
                latencies.append(time.monotonic() - began)
            time.sleep(max(0.0, 2.0 - (time.monotonic() - began)))
        return latencies
    finally:
        process.terminate()
        process.wait(60)


def backlog_seconds(work: Path, runner: Runner, inputs: Path) -> float:
    """Seconds a driver takes, from empty state, to process every file of ``inputs`` and stop."""
    folder = work / f"backlog-{runner.name}-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    run = run_process(runner.command(inputs, folder / "out.jsonlines", folder / "state", True),
                      folder / "driver.log", env=runner.env, timeout=3600)
    if run.returncode != 0:
        raise SystemExit(f"{runner.name}: the backlog run failed; see {folder}/driver.log")
    counted = counted_words(folder / "out.jsonlines", changelog=runner.name == "spark_app")
    expected = len(list(inputs.glob("part-*.csv"))) * ROWS_PER_FILE
    if counted != expected:
        raise SystemExit(f"{runner.name} counted {counted:,} words of {expected:,}; see {folder}")
    shutil.rmtree(folder)
    return run.seconds


def counted_words(path: Path, changelog: bool) -> int:
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


# ---- report ---------------------------------------------------------------------------------

def compared(per_round: dict[str, list[float]], higher_is_better: bool = False) -> dict[str, Any]:
    """Medians of each side, spark_app over the baseline, and the spread of per-round ratios."""
    ours, theirs = per_round["spark_app"], per_round["structured_streaming"]
    ratios = sorted(a / b for a, b in zip(ours, theirs, strict=True))
    return {"spark_app": ours, "structured_streaming": theirs,
            "median_spark_app": round(statistics.median(ours), 3),
            "median_structured_streaming": round(statistics.median(theirs), 3),
            "ratio": round(statistics.median(ours) / statistics.median(theirs), 3),
            "ratio_spread": [round(ratios[0], 3), round(ratios[-1], 3)],
            "higher_is_better": higher_is_better}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16_000_000, help="the larger backlog (the smaller is an eighth)")
    parser.add_argument("--files", type=int, default=30, help="small files timed per latency round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-persistence-"))
    progress(f"working in {work}")
    rng = random.Random(3)
    large, small = work / "backlog-large", work / "backlog-small"
    files = max(5, args.rows // ROWS_PER_FILE)
    write_files(large, 0, files)
    small.mkdir()
    for path in sorted(large.glob("part-*.csv"))[: files // SMALL_SHARE]:
        shutil.copy(path, small / path.name)
    starts: dict[str, list[float]] = {"spark_app": [], "structured_streaming": []}
    latencies: dict[str, list[float]] = {"spark_app": [], "structured_streaming": []}
    p50s: dict[str, list[float]] = {"spark_app": [], "structured_streaming": []}
    throughputs: dict[str, list[float]] = {"spark_app": [], "structured_streaming": []}
    try:
        for number in range(args.rounds):
            for runner in runners() if number % 2 == 0 else reversed(runners()):
                starts[runner.name].append(start_cost(work, runner, rng))
                times = batch_latencies(work, runner, args.files, rng)
                latencies[runner.name] += times
                p50s[runner.name].append(statistics.median(times))
                seconds = (backlog_seconds(work, runner, large), backlog_seconds(work, runner, small))
                rows = (files - files // SMALL_SHARE) * ROWS_PER_FILE
                throughputs[runner.name].append(rows / (seconds[0] - seconds[1]))
                progress(f"round {number + 1}/{args.rounds} {runner.name}: start {starts[runner.name][-1]:.2f} s, "
                         f"batch latency p50 {p50s[runner.name][-1]:.3f} s, "
                         f"backlog {throughputs[runner.name][-1]:,.0f} rows/s ({seconds[0]:.1f} s for "
                         f"{files * ROWS_PER_FILE:,} rows, {seconds[1]:.1f} s for {files // SMALL_SHARE * ROWS_PER_FILE:,})")
        results: dict[str, Any] = {
            "start_seconds": compared(starts),
            "start_cost_over_baseline_seconds": round(statistics.median(starts["spark_app"])
                                                      - statistics.median(starts["structured_streaming"]), 3),
            "batch_latency_p50_seconds": compared(p50s),
            "batch_latencies_seconds": latencies,
            "backlog_rows_per_second": compared(throughputs, higher_is_better=True),
            "backlog_rows": [files * ROWS_PER_FILE, files // SMALL_SHARE * ROWS_PER_FILE],
            "goals": {"start_cost_over_baseline_seconds": "<= 1.0", "batch_latency_ratio": "<= 1.05",
                      "throughput_ratio": ">= 0.95"},
            "notes": "wall-clock times of fresh driver processes on a shared 2-core machine; the baseline is "
                     "Structured Streaming with spark_app's start-up aids",
        }
        for name, key in (("start", "start_seconds"), ("batch latency p50", "batch_latency_p50_seconds"),
                          ("backlog rows/s", "backlog_rows_per_second")):
            shown = results[key]
            progress(f"{name}: spark_app {shown['median_spark_app']:,} vs Structured Streaming "
                     f"{shown['median_structured_streaming']:,}: ratio {shown['ratio']} "
                     f"({shown['ratio_spread'][0]} to {shown['ratio_spread'][1]})")
        write_results("persistence", results)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
