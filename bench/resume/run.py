"""`make bench-resume`: when a driver dies with a large state, how long until the pipeline
shows output again, on a volume and on S3, and does that grow with its history?

Every figure is the wall-clock time from a driver process's start to the first output
line of a file that arrived while it was down, read off the output as it grows. The
driver's own start-up line (spark_app.runtime.startup) splits it: the JVM, the session
and the declarations; opening the state; restoring the outputs' state; the first batch,
with what Spark's state store reported of its load.

Cases (each on the filesystem and on the local S3 server, moto's, in a process of its
own on loopback):

* floor: a new process with spark_app's session (the same jars, class archive and Python
  launcher) running one micro-batch of a one-row file, no state: what any start costs.
* empty state: the same pipeline (each kind, each backend) started on empty state with the
  resume's one new file: the resume less this is what the state itself costs a start.
* sizes: a grouped count over 1M, 4M and 16M distinct keys (`--sizes`), and a
  deduplication with a watermark (`--dedup-keys`): the history is processed once from
  empty state (the recompute, timed to its last file's output), then the driver is
  started again `--rounds` times, each time with one new file (the resume).
* history: the same number of keys committed in 10 batches and in 1,000 batches.
* intervals: a steady stream of small files at snapshot intervals of 1, 10 and 60 s: the
  latency of each file to its output, the throughput of a backlog, and after a kill -9
  how much changelog the restart replays and how long it takes.

Results: bench/results/resume-<time>.json, and a table on stdout for the README.
Recovery under the operator (kill -> next output, on the local cluster) is
bench/resume/recovery.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import (  # noqa: E402
    REPO,
    SPARK_CONF,
    kill_driver,
    process_cpu_seconds,
    progress,
    run_process,
    spark_app,
    stop_on_sigterm,
    write_results,
)
from bench.resume.round_trips import RoundTrips  # noqa: E402
from localcluster.procs import free_port  # noqa: E402
from spark_app.runtime.startup import LINE_PREFIX, parse  # noqa: E402

PIPELINE = str(REPO / "bench/resume/pipeline.py")
FLOOR = str(REPO / "bench/resume/floor.py")
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench-access-key", "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
                  "AWS_DEFAULT_REGION": "us-east-1"}
KEYS_PER_FILE = 500_000
"""The history's files: large enough that the history's batches are few (the default
bound of a batch is 128 MiB), small enough that no file is read alone in blocks."""


# ---- where the state lives ------------------------------------------------------------------

class S3:
    """moto's S3 server in a process of its own on loopback, stopped by its pid; with
    ``round_trips``, the drivers reach it through a proxy that answers each request a round
    trip later (`round_trips.py`; ``round_trip_ms`` sets it), and the benchmark's own setup
    reaches it directly."""

    def __init__(self, log: Path, round_trips: bool = False) -> None:
        self.port = free_port()
        self._direct = f"http://127.0.0.1:{self.port}"
        self._log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self._process = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1",
                                          "-p", str(self.port)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    raise SystemExit(f"the S3 server did not start; see {log}") from None
                time.sleep(0.2)
        os.environ.update(S3_CREDENTIALS)
        self._round_trips = RoundTrips(self.port, 0.0, log.with_name("s3-round-trips.log")) if round_trips else None
        self.endpoint = self._round_trips.endpoint if self._round_trips else self._direct

    def round_trip(self, ms: float) -> None:
        if self._round_trips is not None:
            self._round_trips.delay_s = ms / 1000
        elif ms:
            raise ValueError("this S3 server was started without round trips")

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self._direct, region_name="us-east-1")

    def new_prefix(self) -> str:
        bucket = f"resume-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(Bucket=bucket)
        return f"s3://{bucket}/state"

    def size(self, uri: str) -> int:
        bucket, prefix = uri.removeprefix("s3://").split("/", 1)
        total = 0
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            total += sum(item["Size"] for item in page.get("Contents", []))
        return total

    def usage(self) -> tuple[float, Counter[str]]:
        """The server's CPU seconds so far (it shares the machine's cores with the driver) and
        the requests it has logged, by method (one line each: `"GET /bucket/key HTTP/1.1" 200`)."""
        cpu = process_cpu_seconds(self._process.pid)
        self._log.flush()
        methods: Counter[str] = Counter()
        for line in self._log_path.read_bytes().splitlines():
            if b' HTTP/1.1" ' in line:
                methods[line.split(b'"', 2)[1].split(b" ", 1)[0].decode()] += 1
        return cpu, methods

    def stop(self) -> None:
        if self._round_trips is not None:
            self._round_trips.stop()
        self._process.terminate()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._log.close()


@dataclass
class Case:
    """One pipeline's folders and state location."""

    name: str
    kind: str
    folder: Path
    state: str
    s3: S3 | None = None
    runs: int = 0
    markers: list[str] = field(default_factory=list)

    @property
    def inputs(self) -> Path:
        return self.folder / "inputs"

    @property
    def output(self) -> Path:
        return self.folder / "out.jsonlines"

    def args(self, *extra: str) -> list[str]:
        args = spark_app(PIPELINE, "--kind", self.kind, "--input", str(self.inputs), "--output", str(self.output),
                         "--state", self.state, *extra)
        return args + (["--endpoint-url", self.s3.endpoint] if self.s3 else [])

    def log(self, what: str) -> Path:
        self.runs += 1
        return self.folder / f"{self.runs:02d}-{what}.log"

    def state_bytes(self) -> int:
        if self.s3 is not None:
            return self.s3.size(self.state)
        return sum(p.stat().st_size for p in Path(self.state).rglob("*") if p.is_file())


def new_case(work: Path, name: str, kind: str, backend: str, s3: S3 | None) -> Case:
    folder = work / name
    folder.mkdir(parents=True)
    state = s3.new_prefix() if backend == "s3" and s3 else str(folder / "state")
    return Case(name, kind, folder, state, s3 if backend == "s3" else None)


# ---- input ----------------------------------------------------------------------------------

def write_history(case: Case, keys: int, files: int) -> None:
    """``keys`` distinct keys in ``files`` files (a count), or as many distinct event ids
    within one hour (a deduplication)."""
    case.inputs.mkdir(parents=True, exist_ok=True)
    per_file = keys // files
    for number in range(files):
        first = number * per_file
        if case.kind == "count":
            text = "key\n" + "".join(f"k{k:09d}\n" for k in range(first, first + per_file))
        else:
            text = "id,at\n" + "".join(f"e{k:09d},2026-11-27 10:{(k // 60_000) % 60:02d}:{(k // 1000) % 60:02d}\n"
                                       for k in range(first, first + per_file))
        _arrive(case.inputs, f"history-{number:05d}.csv", text)


def write_marker(case: Case, rows: list[str] | None = None) -> str:
    """One new file: a new key (or event id) that shows in the output once its batch is
    committed; ``rows``, if given, are written with it (updates of existing keys)."""
    marker = f"m{len(case.markers):03d}x{uuid.uuid4().hex[:6]}"
    case.markers.append(marker)
    if case.kind == "count":
        text = "key\n" + "".join(f"{r}\n" for r in (rows or [])) + f"{marker}\n"
    else:
        text = "id,at\n" + f"{marker},2026-11-27 10:30:00\n"
    _arrive(case.inputs, f"new-{marker}.csv", text)
    return marker


def write_updates(case: Case, rng: random.Random, keys: int, updates: int) -> str:
    """A new file of ``updates`` updates of keys drawn from ``keys``, and its marker."""
    return write_marker(case, [f"k{rng.randrange(keys):09d}" for _ in range(updates)])


def _arrive(folder: Path, name: str, text: str) -> None:
    temporary = folder / f".{name}.tmp"
    temporary.write_text(text)
    temporary.rename(folder / name)


class Tail:
    """Watches an output file for a marker, reading only what was appended since."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = path.stat().st_size if path.exists() else 0
        self._carry = b""

    def has(self, marker: str) -> bool:
        needle = f'"{marker}"'.encode()
        try:
            with open(self._path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return False
        self._offset += len(data)
        window = self._carry + data
        self._carry = window[-len(needle):]
        return needle in window


# ---- one driver run -------------------------------------------------------------------------

def timed_to_marker(case: Case, what: str, marker: str, *extra: str, kill: bool = False) -> dict[str, Any]:
    """Starts a driver and times it to ``marker``'s output line; then, once it has logged
    where its start went, stops it (SIGTERM, or SIGKILL with ``kill``). Returns the time
    and the driver's start-up split."""
    tail = Tail(case.output)
    log = case.log(what)
    run = run_process(case.args(*extra), log, until=lambda: tail.has(marker), timeout=7200,
                      stop_signal=signal.SIGKILL if kill else signal.SIGTERM,
                      linger=lambda: LINE_PREFIX in log.read_text(errors="replace"))
    if not tail.has(marker) and marker not in _text(case.output):
        raise SystemExit(f"{case.name}: {what} ended (code {run.returncode}) before {marker} was output; see {log}")
    lines = parse(run.log)
    restored = _restored(run.log)
    return {"seconds": run.seconds, "startup": asdict(lines[0]) if lines else None, "output_state": restored,
            "log": str(log.relative_to(log.parents[2]))}


def start_driver(case: Case, log: Path, *extra: str, conf: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A driver left running, in a session of its own (for kill_driver), its output in
    ``log``; ``conf`` in place of the benchmark's SPARK_CONF."""
    return subprocess.Popen(case.args(*extra), cwd=REPO, start_new_session=True,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                            env={**os.environ, "PYTHONUNBUFFERED": "1",
                                 "SPARK_APP_SPARK_CONF": json.dumps(conf or SPARK_CONF)})


def run_until_idle(case: Case, what: str, *extra: str) -> float:
    log = case.log(what)
    run = run_process(case.args("--stop-when-idle", *extra), log, timeout=7200)
    if run.returncode != 0:
        raise SystemExit(f"{case.name}: {what} failed with code {run.returncode}; see {log}")
    return run.seconds


def _restored(log: str) -> dict[str, int] | None:
    """What the keyed output's recovery logged: keys restored, changelog lines replayed."""
    import re

    match = re.search(r"state of (\d+) keys restored \(snapshot at byte (\d+), (\d+) changelog lines replayed\)", log)
    if match is None:
        return None
    restored = {"keys": int(match[1]), "snapshot_at_byte": int(match[2]), "lines_replayed": int(match[3])}
    # Restored beside the query's start (sinks/base.py); the first batch waited what was left.
    timing = re.search(r"state restored ([\d.]+)s after the driver started it, waited ([\d.]+)s", log)
    if timing is not None:
        restored.update(restore_s=float(timing[1]), waited_s=float(timing[2]))
    return restored


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


# ---- cases ----------------------------------------------------------------------------------

def floor_once(work: Path, name: str) -> float:
    """One floor run: a bare session and a one-row micro-batch, to its output line."""
    folder = work / f"floor-{name}"
    (folder / "inputs").mkdir(parents=True)
    _arrive(folder / "inputs", "one.csv", "key\nfloor\n")
    output = folder / "out.jsonlines"
    tail = Tail(output)
    run = run_process([sys.executable, FLOOR, "--input", str(folder / "inputs"), "--output", str(output)],
                      folder / "floor.log", until=lambda: tail.has("floor"))
    if not tail.has("floor") and "floor" not in _text(output):
        raise SystemExit(f"the floor run ended (code {run.returncode}) without output; see {folder}/floor.log")
    return run.seconds


def empty_once(work: Path, kind: str, backend: str, name: str, s3: S3 | None) -> dict[str, Any]:
    """The pipeline of ``kind`` started on a new, empty state with one new file, as a
    resume is: what its start costs without the state."""
    case = new_case(work, f"empty-{name}", kind, backend, s3)
    case.inputs.mkdir(parents=True)
    return timed_to_marker(case, "start", write_marker(case))


def size_case(work: Path, kind: str, keys: int, backend: str, rounds: int, s3: S3 | None,
              round_trips_ms: list[float]) -> dict[str, Any]:
    """The history built once, then ``rounds`` rounds of a floor, an empty-state start and a
    resume; on S3 a resume at each of ``round_trips_ms`` in turn (the figures at the first;
    the others as ratios to it, pair by pair)."""
    case = new_case(work, f"{kind}-{keys}-{backend}", kind, backend, s3)
    files = max(1, keys // KEYS_PER_FILE)
    progress(f"{case.name}: writing {keys:,} keys in {files} files")
    write_history(case, keys, files)
    marker = write_marker(case)
    progress(f"{case.name}: recomputing from empty state up to the newest file's output")
    recompute = timed_to_marker(case, "recompute", marker)
    progress(f"{case.name}: recomputed in {recompute['seconds']:.1f} s; letting the state settle")
    run_until_idle(case, "settle")  # whatever the stop left in flight; then a snapshot is at most an interval old
    state_bytes = case.state_bytes()
    resumes: list[dict[str, Any]] = []
    others: dict[str, list[dict[str, Any]]] = {}
    for number in range(rounds):
        # The references in the same round, right before the resume: this machine's speed
        # drifts by the hour, and a reference measured minutes apart compared with the drift.
        delays = round_trips_ms if case.s3 else round_trips_ms[:1]
        if case.s3 and s3:
            s3.round_trip(delays[0])
        floor_s = floor_once(work, f"{case.name}-{number}")
        empty = empty_once(work, kind, backend, f"{case.name}-{number}", s3)
        for delay in delays:
            if case.s3 and s3:
                s3.round_trip(delay)
            resumed = resume_once(case, f"resume-{number}" + (f"-rtt{delay:g}ms" if delay else ""), s3)
            if delay != delays[0]:
                others.setdefault(f"{delay:g}", []).append(resumed)
                progress(f"{case.name}: round {number + 1}/{rounds}: resume with {delay:g} ms a request "
                         f"{resumed['seconds']:.1f} s ({_split(resumed)}{_server(resumed)})")
                continue
            resumed.update(floor_s=floor_s, empty_state_s=empty["seconds"])
            resumes.append(resumed)
        if case.s3 and s3:
            s3.round_trip(round_trips_ms[0])  # the history and interval cases run at the first
        first = resumes[-1]
        progress(f"{case.name}: round {number + 1}/{rounds}: floor {floor_s:.1f} s, on empty state "
                 f"{empty['seconds']:.1f} s, resume{f' with {delays[0]:g} ms a request' if delays[0] else ''} "
                 f"{first['seconds']:.1f} s ({_split(first)}{_server(first)})")
    median = statistics.median(r["seconds"] for r in resumes)
    return {"case": case.name, "kind": kind, "keys": keys, "backend": backend, "history_files": files,
            "state_bytes": state_bytes, "recompute": recompute, "resumes": resumes,
            "resume_median_seconds": median, "resume_spread_seconds": [min(r["seconds"] for r in resumes),
                                                                        max(r["seconds"] for r in resumes)],
            "floor_median_seconds": statistics.median(r["floor_s"] for r in resumes),
            "empty_state_median_seconds": statistics.median(r["empty_state_s"] for r in resumes),
            "resume_over_floor": statistics.median(r["seconds"] / r["floor_s"] for r in resumes),
            "state_cost_seconds": statistics.median(r["seconds"] - r["empty_state_s"] for r in resumes),
            "ratio_to_recompute": round(median / recompute["seconds"], 3),
            "s3_round_trip_ms": round_trips_ms[0] if case.s3 else None,
            "at_other_round_trips": {
                delay: {"resumes": runs, "resume_median_seconds": statistics.median(r["seconds"] for r in runs),
                        "over_first_round_trip": statistics.median(r["seconds"] / f["seconds"]
                                                                   for r, f in zip(runs, resumes, strict=True))}
                for delay, runs in others.items()}}


def resume_once(case: Case, what: str, s3: S3 | None) -> dict[str, Any]:
    """One resume with one new file, and on S3 what the server did meanwhile."""
    marker = write_marker(case)
    before = s3.usage() if case.s3 and s3 else None
    resumed = timed_to_marker(case, what, marker)
    if before is not None and s3 is not None:
        after = s3.usage()
        methods = after[1] - before[1]
        resumed["s3_server"] = {"cpu_seconds": round(after[0] - before[0], 2), "requests": methods.total(),
                                "by_method": dict(methods.most_common())}
    return resumed


def _server(run: dict[str, Any]) -> str:
    server = run.get("s3_server")
    return f"; S3 server {server['cpu_seconds']} CPU s, {server['requests']} requests" if server else ""


def history_cases(work: Path, keys: int, batch_counts: list[int], backend: str, rounds: int,
                  s3: S3 | None) -> list[dict[str, Any]]:
    """The same keys committed in each of ``batch_counts`` batches; once every history is
    built, each is resumed in turn, round after round, so that their ratio is taken pair by
    pair rather than across the minutes a long history takes to build."""
    cases = []
    for batches in batch_counts:
        case = new_case(work, f"history-{batches}-{backend}", "count", backend, s3)
        progress(f"{case.name}: {keys:,} keys committed in {batches} batches")
        write_history(case, keys, batches)
        cases.append((batches, case, run_until_idle(case, "history", "--max-files-per-trigger", "1"), []))
    for number in range(rounds):
        for _batches, case, _built, resumes in cases:
            resumes.append(timed_to_marker(case, f"resume-{number}", write_marker(case)))
            progress(f"{case.name}: resume {number + 1}/{rounds} {resumes[-1]['seconds']:.1f} s ({_split(resumes[-1])})")
    first = cases[0][3]
    return [{"case": case.name, "keys": keys, "batches": batches, "backend": backend, "history_seconds": built,
             "state_bytes": case.state_bytes(), "resumes": resumes,
             "resume_median_seconds": statistics.median(r["seconds"] for r in resumes),
             "over_first_history": statistics.median(r["seconds"] / f["seconds"] for r, f in zip(resumes, first, strict=True))}
            for batches, case, built, resumes in cases]


def interval_case(work: Path, keys: int, interval_s: float, backend: str, seconds: float,
                  s3: S3 | None, kill_after_s: float | None = None) -> dict[str, Any]:
    """A steady stream of small files at one snapshot interval: each file's latency to its
    output line, a backlog's throughput, then a kill -9 at a random moment of the next
    interval (or ``kill_after_s`` after the backlog's last output line: 0 is the driver lost
    before a snapshot covers the backlog, whose output lines the restart then replays) and
    the restart."""
    case = new_case(work, f"interval-{interval_s:g}s-{backend}", "count", backend, s3)
    interval_ms = str(int(interval_s * 1000))
    progress(f"{case.name}: {keys:,} keys of state")
    write_history(case, keys, max(1, keys // KEYS_PER_FILE))
    run_until_idle(case, "history", "--snapshot-interval-ms", interval_ms)
    rng = random.Random(11)
    log = case.log("steady")
    process = start_driver(case, log, "--snapshot-interval-ms", interval_ms)
    try:
        tail = Tail(case.output)
        warm = write_marker(case)
        wait_for(lambda: tail.has(warm), process, log, 600)
        latencies = []
        ended = time.monotonic() + seconds
        while time.monotonic() < ended:  # one file of 1,000 updates a second
            began = time.monotonic()
            marker = write_updates(case, rng, keys, 999)
            wait_for(lambda m=marker: tail.has(m), process, log, 120)
            latencies.append(time.monotonic() - began)
            # About one a second, at a random phase to the 200 ms trigger (which Spark keeps
            # to the clock), rather than each file at the moment of the trigger the last
            # one landed at.
            time.sleep(max(0.0, 1.0 - (time.monotonic() - began)) + rng.uniform(0.0, 0.2))
        backlog_rows = 0
        began = time.monotonic()
        for _ in range(20):  # a backlog: 20 files of 50,000 updates, written at once
            marker = write_updates(case, rng, keys, 49_999)
            backlog_rows += 50_000
        wait_for(lambda: tail.has(marker), process, log, 1200)
        throughput = backlog_rows / (time.monotonic() - began)
        time.sleep(rng.uniform(0, interval_s) if kill_after_s is None else kill_after_s)
        kill_driver(process)
    finally:
        if process.poll() is None:
            kill_driver(process)
        process.wait()
    marker = write_marker(case)
    resumed = timed_to_marker(case, "resume-after-kill", marker)
    latencies.sort()
    result = {"case": case.name, "snapshot_interval_s": interval_s, "keys": keys, "backend": backend,
              "latency_p50_s": round(statistics.median(latencies), 3),
              "latency_p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3),
              "files_fed": len(latencies), "backlog_rows_per_s": round(throughput), "resume": resumed,
              "state_bytes": case.state_bytes()}
    progress(f"{case.name}: latency p50 {result['latency_p50_s']} s, backlog {result['backlog_rows_per_s']:,} rows/s, "
             f"resume after kill -9 {resumed['seconds']:.1f} s ({_split(resumed)})")
    return result


def wait_for(condition: Any, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise SystemExit(f"the driver exited with code {process.returncode}; see {log}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no output within {timeout} s; see {log}")
        # A latency is rounded up to this: at 50 ms a file's latency came in steps of 50 ms.
        time.sleep(0.01)


def _split(run: dict[str, Any]) -> str:
    shown = run.get("startup")
    if not shown:
        return "no start-up line"
    parts = [f"JVM+session {shown['declared_s']:.1f}", f"state {shown['state_s']:.1f}",
             f"outputs {shown['recovered_s']:.1f}", f"query start {shown['starting_s']:.1f}",
             f"first batch {shown['batch_s']:.1f}"]
    if shown.get("store_load_s") is not None:
        parts.append(f"(store load {shown['store_load_s']:.1f}, summed)")
    restored = run.get("output_state")
    if restored:
        if restored.get("restore_s") is not None:
            parts.append(f"output state restored in {restored['restore_s']:.1f} beside the start "
                         f"(waited {restored['waited_s']:.1f})")
        parts.append(f"{restored['lines_replayed']:,} output lines replayed")
    return ", ".join(parts)


# ---- report ---------------------------------------------------------------------------------

def table(results: dict[str, Any]) -> str:
    rows = ["| case | state | recompute | floor | on empty state | resume (median, spread) | resume / floor "
            "| the goal: floor + the state at 200 MB/s | the state's cost: resume less empty state | "
            "resume / recompute | split of the median resume |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for case in results["sizes"]:
        resumes = sorted(case["resumes"], key=lambda r: r["seconds"])
        median = resumes[len(resumes) // 2]
        load_s = case["state_bytes"] / 200e6
        goal = case["floor_median_seconds"] + load_s
        rows.append(f"| {case['kind']} {case['keys']:,} keys, {case['backend']} | {case['state_bytes'] / 2**20:,.0f} MiB "
                    f"| {case['recompute']['seconds']:.1f} s | {case['floor_median_seconds']:.1f} s "
                    f"| {case['empty_state_median_seconds']:.1f} s | {case['resume_median_seconds']:.1f} s "
                    f"({case['resume_spread_seconds'][0]:.1f} to {case['resume_spread_seconds'][1]:.1f}) "
                    f"| {case['resume_over_floor']:.2f} | {goal:.1f} s "
                    f"| {case['state_cost_seconds']:+.1f} s (the state at 200 MB/s: {load_s:.1f} s) "
                    f"| {case['ratio_to_recompute']:.2f} | {_split(median)} |")
        for delay, other in case.get("at_other_round_trips", {}).items():
            rows.append(f"| {case['kind']} {case['keys']:,} keys, {case['backend']}, {delay} ms a request | | | | "
                        f"| {other['resume_median_seconds']:.1f} s | | | {other['over_first_round_trip']:.2f}x the "
                        f"resume at {case['s3_round_trip_ms']:g} ms, pair by pair | | |")
    for case in results["history"]:
        rows.append(f"| history: {case['keys']:,} keys in {case['batches']} batches, {case['backend']} "
                    f"| {case['state_bytes'] / 2**20:,.0f} MiB | | | | {case['resume_median_seconds']:.1f} s | | | "
                    f"{case['over_first_history']:.2f}x the first history, pair by pair | | |")
    if results["intervals"]:
        rows += ["", "| snapshot interval | latency of a 1,000-row file, p50 / p99 | backlog rows/s | after kill -9: "
                     "resume, output lines replayed, state store changelog files replayed |",
                 "| --- | --- | --- | --- |"]
        for case in results["intervals"]:
            shown = case["resume"].get("startup") or {}
            restored = case["resume"].get("output_state") or {}
            rows.append(f"| {case['snapshot_interval_s']:g} s | {case['latency_p50_s']:.2f} s / {case['latency_p99_s']:.2f} s "
                        f"| {case['backlog_rows_per_s']:,} | {case['resume']['seconds']:.1f} s, "
                        f"{restored.get('lines_replayed', 0):,} lines, {shown.get('store_replayed_files') or 0} files |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,4000000,16000000", help="distinct keys of the count (empty: none)")
    parser.add_argument("--dedup-keys", type=int, default=4_000_000, help="distinct ids of the deduplication (0: none)")
    parser.add_argument("--backends", default="filesystem,s3")
    parser.add_argument("--rounds", type=int, default=3, help="resumes per case")
    parser.add_argument("--history-keys", type=int, default=1_000_000, help="keys of the history cases (0: none)")
    parser.add_argument("--history-batches", default="10,1000")
    parser.add_argument("--interval-keys", type=int, default=1_000_000, help="keys of the interval cases (0: none)")
    parser.add_argument("--intervals", default="1,10,60", help="snapshot intervals in seconds")
    parser.add_argument("--steady-seconds", type=float, default=90.0)
    parser.add_argument("--kill-after-s", type=float,
                        help="the interval cases' kill, seconds after the backlog's last output line "
                             "(default: a random moment of the next interval)")
    parser.add_argument("--s3-round-trip-ms", default="0",
                        help="hold each S3 answer back this long, as a real S3's round trip; a list (0,20) "
                             "resumes each size's S3 case at each in turn (default: 0, no proxy)")
    parser.add_argument("--work", help="a folder to work in (default: a new temporary one, removed at the end)")
    args = parser.parse_args()
    stop_on_sigterm()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    progress(f"working in {work}")
    backends = [b for b in args.backends.split(",") if b]
    round_trips_ms = [float(ms) for ms in args.s3_round_trip_ms.split(",") if ms]
    s3 = S3(work / "s3.log", round_trips=any(round_trips_ms)) if "s3" in backends else None
    results: dict[str, Any] = {"sizes": [], "history": [], "intervals": [], "s3_round_trips_ms": round_trips_ms}
    try:
        for backend in backends:
            for keys in [int(k) for k in args.sizes.split(",") if k]:
                results["sizes"].append(size_case(work, "count", keys, backend, args.rounds, s3, round_trips_ms))
            if args.dedup_keys:
                results["sizes"].append(size_case(work, "dedup", args.dedup_keys, backend, args.rounds, s3,
                                                  round_trips_ms))
        if args.history_keys:
            results["history"] = history_cases(work, args.history_keys,
                                               [int(b) for b in args.history_batches.split(",") if b],
                                               backends[0], args.rounds, s3)
        if args.interval_keys:
            for interval in [float(i) for i in args.intervals.split(",") if i]:
                results["intervals"].append(interval_case(work, args.interval_keys, interval, backends[0],
                                                          args.steady_seconds, s3, args.kill_after_s))
        results["table"] = table(results)
        print(results["table"])
        write_results("resume", results)
    finally:
        if s3 is not None:
            s3.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
