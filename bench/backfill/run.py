"""`make bench-backfill`: a new reader of a large keyed Delta table that keeps changing.

An upstream table of ROWS rows (id, value; 100 files in id order, its change data feed
on) receives a steady stream of changes: every TICK_S a MERGE inserts 100 new ids,
updates one random id, and sets a *marker* on an id that any reader has already read
(value = MARKER_BASE + n). A reader's latency for a live change is the time from the
marker's commit to its row in the reader's output.

1. spark_app's backfill, unthrottled: rows/s, and marker latency during the backfill and
   after it (the reader's steady state).
2. The rate held at three limits (by default a quarter, half and three quarters of the
   unthrottled rate), each set while the reader runs (its live settings file).
3. A kill -9 at about half way: rows read again after the restart, and the time to finish
   against the unkilled run.
4. Delta's own change-data-feed stream on the same table (snapshot as the first batch,
   then the changes): marker latency while it reads its snapshot.

    .venv/bin/python bench/backfill/run.py [--rows 10000000] [--limits 0.25,0.5,0.75]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from bench.common import REPO, SPARK_CONF, kill_driver, progress, spark_app, write_results  # noqa: E402
from spark_app.persistence import Backend  # noqa: E402
from spark_app.runtime.jvm.conf import spark_conf  # noqa: E402
from spark_app.runtime.jvm.session import build_session  # noqa: E402

HERE = Path(__file__).resolve().parent
CASES = ("unthrottled", "limits", "kill", "native")
MARKER_BASE = 10**15
TICK_S = 2.0
NEW_IDS_PER_TICK = 100
PLAN_LINE = re.compile(r"^(\S+ \S+) INFO spark_app: backfill upstream: plan (\d+) at version (\d+): (\d+) changes, "
                       r"(\d+) rows read \((.*)\)$")
COMMIT_LINE = re.compile(r"^(\S+ \S+) INFO spark_app: query \S+: committed batch (\d+) \(upstream: (\d+) plans\)$")


def log_time(stamp: str) -> float:
    """A logging timestamp ("2026-11-24 07:15:46,495", local time) as seconds since the epoch."""
    whole, millis = stamp.split(",")
    return time.mktime(time.strptime(whole, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


@dataclass(frozen=True)
class PlanLine:
    at: float
    number: int
    version: int
    changes: int
    rows: int
    done: bool


def plans(text: str) -> list[PlanLine]:
    found = []
    for line in text.splitlines():
        m = PLAN_LINE.match(line)
        if m:
            found.append(PlanLine(log_time(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), "backfill done" in m[6]))
    return found


def committed_plans(text: str) -> list[int]:
    return [int(m[3]) for m in map(COMMIT_LINE.match, text.splitlines()) if m]


class Upstream:
    """The upstream table and its writer (a SparkSession in this process)."""

    def __init__(self, spark: SparkSession, path: Path, rows: int, files: int) -> None:
        self.spark, self.path, self.rows = spark, str(path), rows
        self.next_id = rows
        self.files = files
        self.chance = random.Random(11)
        self.marker = 0
        self.committed: dict[int, float] = {}
        """marker number -> when its commit returned"""

    def create(self) -> float:
        began = time.monotonic()
        (self.spark.range(self.rows).repartitionByRange(self.files, "id")
         .select("id", (F.col("id") * 7919 % 1_000_003).alias("value"))
         .write.format("delta").option("delta.enableChangeDataFeed", "true").save(self.path))
        return time.monotonic() - began

    def tick(self, marked_id: int) -> None:
        """One MERGE: 100 new ids, one random update, one marker on ``marked_id``."""
        from delta.tables import DeltaTable

        self.marker += 1
        updated = self.chance.randrange(self.rows)
        new = range(self.next_id, self.next_id + NEW_IDS_PER_TICK)
        self.next_id += NEW_IDS_PER_TICK
        rows = [(marked_id, MARKER_BASE + self.marker), (updated, self.chance.randrange(1_000_003))]
        rows += [(i, i % 1_000_003) for i in new]
        ids = ", ".join(str(r[0]) for r in rows)
        source = self.spark.createDataFrame(rows, "id BIGINT, value BIGINT")
        # The literal list lets Delta skip every file that holds none of these ids.
        (DeltaTable.forPath(self.spark, self.path).alias("t")
         .merge(source.alias("s"), f"t.id = s.id AND t.id IN ({ids})")
         .whenMatchedUpdate(set={"value": "s.value"}).whenNotMatchedInsertAll().execute())
        self.committed[self.marker] = time.time()


@dataclass
class Reader:
    """A reader process, and the markers seen in its output with when they were first seen."""

    name: str
    args: list[str]
    folder: Path
    output: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    seen: dict[int, float] = field(default_factory=dict)
    started_at: float = 0.0
    logs: list[Path] = field(default_factory=list)

    def start(self) -> Reader:
        """Starts the process, and a thread that notes when each marker first shows (a MERGE
        of the upstream table takes seconds: the watching must not wait for it)."""
        log = self.folder / f"{self.name}-{len(self.logs)}.log"
        self.logs.append(log)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPARK_APP_SPARK_CONF": json.dumps(SPARK_CONF),
               "SPARK_APP_TERMINATION_LOG": str(log) + ".end", **self.env}
        with open(log, "wb") as handle:
            self.process = subprocess.Popen(self.args, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        self.started_at = self.started_at or time.time()
        threading.Thread(target=self._watch, args=(self.process,), daemon=True).start()
        return self

    def _watch(self, process: subprocess.Popen[bytes]) -> None:
        while process.poll() is None:
            self.poll_markers()
            time.sleep(0.1)

    def text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def poll_markers(self) -> None:
        now = time.time()
        for value in _marker_values(self.output):
            self.seen.setdefault(value - MARKER_BASE, now)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        assert self.process is not None
        if self.process.poll() is None:
            kill_driver(self.process)
        self.process.wait()

    def stop(self) -> None:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


def _marker_values(output: Path) -> list[int]:
    files = [output] if output.is_file() else sorted(output.glob("part-*.json")) if output.is_dir() else []
    values = []
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if row.get("diff", 1) == 1 and row["value"] >= MARKER_BASE:
                values.append(int(row["value"]))
    return values


def drive(upstream: Upstream, reader: Reader, until: Any, timeout_s: float, ticking: bool = True,
          marked_id: int = 7) -> None:
    """Ticks the upstream table every TICK_S (unless not ``ticking``) until ``until()``.
    The marked id is in the first chunk: every reader has read it once it reads at all."""
    deadline = time.monotonic() + timeout_s
    next_tick = time.monotonic()
    while not until():
        if not reader.alive():
            raise RuntimeError(f"{reader.name} exited: {reader.text()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{reader.name} ran over {timeout_s}s")
        if ticking and time.monotonic() >= next_tick:
            upstream.tick(marked_id)
            next_tick = time.monotonic() + TICK_S
        time.sleep(0.05)


def latencies(upstream: Upstream, reader: Reader, first: int, last: int) -> dict[str, Any]:
    """Marker latency (s) for markers first..last that the reader showed."""
    values = sorted(reader.seen[m] - upstream.committed[m] for m in range(first, last + 1)
                    if m in reader.seen and m in upstream.committed)
    if not values:
        return {"markers": 0}
    return {"markers": len(values), "p50_s": round(statistics.median(values), 2),
            "p99_s": round(values[min(len(values) - 1, int(0.99 * len(values)))], 2),
            "max_s": round(values[-1], 2)}


def ours(folder: Path, name: str, table: str, chunk_rows: int, extra_env: dict[str, str] | None = None) -> Reader:
    state, out = folder / name / "state", folder / name / "out"
    out.mkdir(parents=True, exist_ok=True)
    args = spark_app(str(HERE / "reader.py"), "--table", table, "--out-dir", str(out), "--state", str(state),
                     "--chunk-rows", str(chunk_rows))
    return Reader(name, args, folder / name, out / "markers.jsonlines", env=extra_env or {})


def case_unthrottled(upstream: Upstream, folder: Path, chunk_rows: int, steady_s: float) -> dict[str, Any]:
    progress("1/4 spark_app's backfill, unthrottled, while the table changes")
    reader = ours(folder, "unthrottled", upstream.path, chunk_rows).start()
    drive(upstream, reader, lambda: bool(plans(reader.text())), timeout_s=600, ticking=False)
    first_marker = upstream.marker + 1
    drive(upstream, reader, lambda: any(p.done for p in plans(reader.text())), timeout_s=7200)
    done_marker = upstream.marker
    log = plans(reader.text())
    done_at = next(p.at for p in log if p.done)
    progress(f"backfill done: {sum(p.rows for p in log)} rows in {done_at - reader.started_at:.0f}s from start; "
             f"following changes for {steady_s:.0f}s")
    settle = time.monotonic() + steady_s
    drive(upstream, reader, lambda: time.monotonic() > settle, timeout_s=steady_s + 600)
    reader.stop()
    log = plans(reader.text())
    reading = [p for p in log if p.rows]
    rows = sum(p.rows for p in reading)
    span = done_at - reading[0].at if len(reading) > 1 else float("nan")
    return {
        "rows_read": rows,
        "plans_with_rows": len(reading),
        "seconds_from_start_to_done": round(done_at - reader.started_at, 1),
        "seconds_first_chunk_to_done": round(span, 1),
        # The first chunk's rows were read before its plan line: counted from the second.
        "rows_per_second": round((rows - reading[0].rows) / span) if len(reading) > 1 else None,
        "latency_during_backfill": latencies(upstream, reader, first_marker, done_marker),
        "latency_steady_state": latencies(upstream, reader, done_marker + 2, upstream.marker),
    }


def case_limits(upstream: Upstream, folder: Path, chunk_rows: int, limits: list[float],
                window_s: float) -> list[dict[str, Any]]:
    progress(f"2/4 the rate held at {limits} rows/s, each set while the reader runs")
    live = folder / "limits" / "live-settings.json"
    live.parent.mkdir(parents=True, exist_ok=True)

    def set_rate(rate: float) -> None:
        temporary = live.with_suffix(".tmp")
        temporary.write_text(json.dumps({"backfill": {"upstream": {"rowsPerSecond": rate}}}))
        temporary.rename(live)

    set_rate(0)
    reader = ours(folder, "limits", upstream.path, chunk_rows, {"SPARK_APP_LIVE_SETTINGS_FILE": str(live)}).start()
    # Paused until its first plan (the table's count), so each window measures reading only.
    drive(upstream, reader, lambda: bool(plans(reader.text())), timeout_s=600)
    held = []
    for rate in limits:
        set_rate(rate)
        began = time.time()
        end = time.monotonic() + window_s
        drive(upstream, reader, lambda end=end: time.monotonic() > end, timeout_s=window_s + 600)
        # From the second plan after the change: the first may hold allowance from before.
        window = [p for p in plans(reader.text()) if p.at > began and p.rows][1:]
        measured = (sum(p.rows for p in window[1:]) / (window[-1].at - window[0].at)) if len(window) > 2 else None
        held.append({"limit": rate, "measured_rows_per_second": round(measured) if measured else None,
                     "ratio": round(measured / rate, 3) if measured else None, "plans": len(window)})
        progress(f"limit {rate:g} rows/s: measured {held[-1]['measured_rows_per_second']}")
    reader.stop()
    return held


def case_kill(upstream: Upstream, folder: Path, chunk_rows: int, unkilled_s: float | None) -> dict[str, Any]:
    progress("3/4 kill -9 at about half way, then resume")
    reader = ours(folder, "killed", upstream.path, chunk_rows).start()

    def halfway() -> bool:
        log = plans(reader.text())
        return bool(log) and _fraction(reader.text()) >= 0.5

    drive(upstream, reader, halfway, timeout_s=7200)
    reader.kill()
    before = reader.text()
    committed_at_kill = max(committed_plans(before), default=0)
    progress(f"killed at plan {max(p.number for p in plans(before))} ({_fraction(before):.0%}), "
             f"{committed_at_kill} plans committed; restarting")
    reader.start()
    drive(upstream, reader, lambda: any(p.done for p in plans(reader.text())), timeout_s=7200)
    reader.stop()
    after = reader.logs[-1].read_text(errors="replace")
    first_commit = min((p for p in committed_plans(after) if p > committed_at_kill), default=committed_at_kill)
    rows_of = {p.number: p.rows for p in plans(reader.text())}
    replayed = range(committed_at_kill + 1, first_commit + 1)
    done_at = next(p.at for p in plans(after) if p.done)
    return {
        "killed_at_fraction": round(_fraction(before), 3),
        "plans_committed_at_kill": committed_at_kill,
        "plans_read_again": len(replayed),
        "rows_read_again": sum(rows_of.get(n, 0) for n in replayed),
        "chunk_rows": chunk_rows,
        "seconds_to_done_with_the_kill": round(done_at - reader.started_at, 1),
        "seconds_to_done_unkilled": unkilled_s,
        "ratio": round((done_at - reader.started_at) / unkilled_s, 2) if unkilled_s else None,
    }


def _fraction(text: str) -> float:
    found = re.findall(r"\((\d+) rows read, (\d+) left\)", text)
    if not found:
        return 1.0 if "backfill done" in text else 0.0
    read, left = map(int, found[-1])
    return read / max(1, read + left)


def case_native(upstream: Upstream, folder: Path, steady_s: float) -> dict[str, Any]:
    progress("4/4 Delta's own change-data-feed stream on the same table")
    out, checkpoint = folder / "native" / "out", folder / "native" / "checkpoint"
    out.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, str(HERE / "native.py"), upstream.path, str(out), str(checkpoint)]
    reader = Reader("native", args, folder / "native", out).start()
    # Its query has planned its first batch (the snapshot): from here on it reads, as ours does.
    drive(upstream, reader, lambda: (checkpoint / "spark" / "offsets" / "0").exists(), timeout_s=600, ticking=False)
    first_marker = upstream.marker + 1
    drive(upstream, reader, lambda: bool(reader.seen), timeout_s=7200)
    snapshot_marker = upstream.marker
    progress(f"its first output after {time.time() - reader.started_at:.0f}s; following changes for {steady_s:.0f}s")
    settle = time.monotonic() + steady_s
    drive(upstream, reader, lambda: time.monotonic() > settle, timeout_s=steady_s + 600)
    reader.stop()
    return {
        "seconds_to_first_output": round(min(reader.seen.values()) - reader.started_at, 1),
        "latency_during_snapshot": latencies(upstream, reader, first_marker, snapshot_marker),
        "latency_steady_state": latencies(upstream, reader, snapshot_marker + 2, upstream.marker),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--chunk-rows", type=int, default=100_000)
    parser.add_argument("--limits", default="0.25,0.5,0.75",
                        help="rows/s; below 1, fractions of the unthrottled rate measured first")
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--steady-s", type=float, default=60.0,
                        help="seconds the reader follows changes after its backfill (its steady state): "
                        "at one MERGE every 7 s or so, 60 s gives about 8 markers")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"which of {','.join(CASES)} to run (limits alone needs --limits in rows/s)")
    options = parser.parse_args()
    cases = set(options.cases.split(","))
    if cases - set(CASES):
        parser.error(f"unknown cases {sorted(cases - set(CASES))}; choose from {', '.join(CASES)}")
    asked = [float(x) for x in options.limits.split(",")]
    if "limits" in cases and "unthrottled" not in cases and any(x < 1 for x in asked):
        parser.error("--limits as fractions need the unthrottled case; give rows/s")
    folder = Path(tempfile.mkdtemp(prefix="bench-backfill-"))
    progress(f"working in {folder}")
    spark = build_session(spark_conf(Backend.filesystem(folder), 10_000,
                                     {**SPARK_CONF, "spark.driver.memory": "2g", "spark.sql.shuffle.partitions": "4"}))
    upstream = Upstream(spark, folder / "table", options.rows, options.files)
    progress(f"creating the upstream table: {options.rows} rows in {options.files} files")
    created_s = upstream.create()
    progress(f"created in {created_s:.0f}s")
    unthrottled: dict[str, Any] = {}
    if "unthrottled" in cases:
        unthrottled = case_unthrottled(upstream, folder, options.chunk_rows, options.steady_s)
    rate = unthrottled.get("rows_per_second") or 1000
    limits = case_limits(upstream, folder, options.chunk_rows, [round(x * rate, -2) if x < 1 else x for x in asked],
                         options.window_s) if "limits" in cases else None
    killed = case_kill(upstream, folder, options.chunk_rows, unthrottled.get("seconds_from_start_to_done")) \
        if "kill" in cases else None
    native = case_native(upstream, folder, options.steady_s) if "native" in cases else None
    ours_during = unthrottled.get("latency_during_backfill", {}).get("p50_s")
    ours_steady = unthrottled.get("latency_steady_state", {}).get("p50_s")
    results = {
        "rows": options.rows, "files": options.files, "chunk_rows": options.chunk_rows, "tick_s": TICK_S,
        "unthrottled": unthrottled, "rate_limits": limits, "kill_at_half": killed, "native": native,
        "ratios": {
            "ours_latency_during_backfill_over_steady_p50": round(ours_during / ours_steady, 2)
            if ours_during and ours_steady else None,
            "native_latency_during_snapshot_over_ours_during_backfill_p50":
                round(native["latency_during_snapshot"]["p50_s"] / ours_during, 1)
                if native and ours_during and native["latency_during_snapshot"].get("p50_s") else None,
        },
    }
    write_results("backfill", results)
    print(json.dumps(results, indent=2))
    spark.stop()


if __name__ == "__main__":
    main()
