"""`make bench-shared`: three consumers of one per-customer aggregate, side by side in one run.

(a) Three pipelines, each recomputing the aggregate from the raw orders (its own state,
    its own output).
(b) One publisher of the aggregate as a shared table (sa.io.tables.publish) and three
    readers of its changes (sa.io.tables.read), each writing them out.

Both read the same ORDERS files (FILES x ROWS orders over CUSTOMERS customers). For each:
total CPU seconds of every process (Python drivers and their JVMs, sampled from /proc),
and of it the JVMs' JIT compiler threads (C1, C2); the bytes of state they keep
(everything under their state roots: the publisher's includes the table), wall time to
read all input, and end-to-end latency of a new order (a file with one order of a new
customer, until it is in all three outputs). Then FILES files of --steady-rows orders
(as many as before by default; the steady phase), to the drivers now running: its CPU
seconds are what new input costs a deployment that has started, read its backlog and
compiled its hot code, and the table versions made meanwhile (the publisher's batches,
and a compaction's if one ran).

Then the publisher's batch latency (a new orders file until the table's next version)
with 0, 1 and 4 readers attached in turn, for --latency-rounds rounds after a warm-up
without readers, each sample with the readers caught up.

    .venv/bin/python bench/shared/run.py [--files 12 --rows 20000 --customers 20000 --markers 5 --repeats 3]

Each of the --repeats pairs runs (a) and (b) in turn (which goes first alternates); the
ratios are per pair, reported as the median with the lowest and highest.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import REPO, SPARK_CONF, kill_driver, progress, spark_app, write_results  # noqa: E402
from spark_app.state.delta_log import TableLog  # noqa: E402
from spark_app.storage import FilesystemStorage  # noqa: E402

HERE = Path(__file__).resolve().parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
HEADER = "order_id,customer_id,region,amount"
STEADY_SENTINEL = "zz-steady"


class Group:
    """A driver process and everything it starts (its own session), with their CPU time."""

    def __init__(self, args: list[str], log: Path) -> None:
        import json

        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPARK_APP_SPARK_CONF": json.dumps(SPARK_CONF),
               "SPARK_APP_TERMINATION_LOG": str(log) + ".end"}
        with open(log, "wb") as out:
            self.process = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        self.log = log
        self._cpu: dict[int, float] = {}
        self.jit = 0.0

    def sample(self) -> None:
        """Each process of the session: its CPU time and that of the children it waited for."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) != self.process.pid:  # the session id
                continue
            ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
            self._cpu[int(entry)] = max(self._cpu.get(int(entry), 0.0), ticks / CLOCK_TICKS)

    @property
    def cpu_seconds(self) -> float:
        return sum(self._cpu.values())

    def jit_seconds(self) -> float:
        """CPU time of the JVM's JIT compiler threads (C1, C2), which live as long as the JVM."""
        total = 0.0
        for pid in self._cpu:
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for task in tasks:
                try:
                    stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
                except OSError:
                    continue
                name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()
                if name.startswith(("C1 CompilerThre", "C2 CompilerThre")):
                    total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        return total

    def stop(self) -> None:
        self.sample()
        self.jit = self.jit_seconds()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                kill_driver(self.process)
                self.process.wait()


def write_orders(folder: Path, name: str, rows: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    tmp.rename(folder / name)


def orders(file: int, rows: int, customers: int, chance: random.Random) -> list[str]:
    return [f"o{file}-{i},c{chance.randrange(customers):07d},{chance.choice('abc')},{chance.randrange(1, 500)}"
            for i in range(rows)]


def contains(path: Path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def wait(what: str, groups: list[Group], done: Any, timeout: float = 3600, poll_s: float = 0.2) -> float:
    """Seconds until ``done()``, checked every ``poll_s``; the drivers' CPU is sampled every
    0.2 s whatever the poll (reading /proc for every process is not free)."""
    began = sampled = time.monotonic()
    while not done():
        if time.monotonic() - sampled >= 0.2:
            sampled = time.monotonic()
            for g in groups:
                g.sample()
                if g.process.poll() is not None:
                    raise RuntimeError(f"{g.log.name} exited with {g.process.returncode} while waiting for {what}; "
                                       f"see {g.log}")
        if time.monotonic() - began > timeout:
            raise TimeoutError(what)
        time.sleep(poll_s)
    return time.monotonic() - began


def latency(work: Path, inputs: Path, outputs: list[Path], groups: list[Group], marker: str) -> float:
    write_orders(inputs, f"{marker}.csv", [f"{marker},{marker},a,1"])
    return wait(f"marker {marker}", groups, lambda: all(contains(o, marker) for o in outputs))


def variant(name: str, work: Path, inputs: Path, starts: list[tuple[str, list[str]]], outputs: list[Path],
            state_roots: list[Path], sentinel: str, markers: int, steady: list[list[str]],
            first_ready: Any = None, versions: Any = None) -> dict[str, Any]:
    progress(f"{name}: {len(starts)} drivers")
    began = time.monotonic()
    groups: list[Group] = []
    for number, (label, args) in enumerate(starts):
        groups.append(Group(args, work / f"{label}.log"))
        if number == 0 and first_ready is not None:
            wait(f"{label} ready", groups, first_ready)
    wait("all input read", groups, lambda: all(contains(o, sentinel) for o in outputs))
    bulk = time.monotonic() - began
    lat = [latency(work, inputs, outputs, groups, f"mk-{name}-{i}") for i in range(markers)]
    # The same input again, to drivers that have started, read a backlog and compiled their
    # hot code: what each new order costs a long-running deployment, without the starts.
    state_bytes = {r.name: folder_bytes(r) for r in state_roots}
    for g in groups:
        g.sample()
    cpu_before = [g.cpu_seconds for g in groups]
    versions_before = versions() if versions else None
    steady_began = time.monotonic()
    for f, rows in enumerate(steady):
        write_orders(inputs, f"steady-{f:04d}.csv", rows)
    wait("the steady input read", groups, lambda: all(contains(o, STEADY_SENTINEL) for o in outputs))
    for g in groups:
        g.sample()
    steady_s = time.monotonic() - steady_began
    steady_cpu = {label: g.cpu_seconds - before
                  for (label, _), g, before in zip(starts, groups, cpu_before, strict=True)}
    for g in groups:
        g.stop()
    result = {"drivers": len(groups), "cpu_seconds": round(sum(g.cpu_seconds for g in groups), 1),
              "cpu_seconds_by_driver": {label: round(g.cpu_seconds, 1) for (label, _), g in zip(starts, groups, strict=True)},
              "jit_cpu_seconds": round(sum(g.jit for g in groups), 1),
              "jit_cpu_seconds_by_driver": {label: round(g.jit, 1) for (label, _), g in zip(starts, groups, strict=True)},
              "steady": {"orders": sum(len(rows) for rows in steady), "cpu_seconds": round(sum(steady_cpu.values()), 1),
                         "cpu_seconds_by_driver": {label: round(cpu, 1) for label, cpu in steady_cpu.items()},
                         "seconds": round(steady_s, 1),
                         "table_versions": versions() - versions_before if versions else None,
                         "state_bytes_after": sum(folder_bytes(r) for r in state_roots)},
              "state_bytes": sum(state_bytes.values()),
              "state_bytes_by_root": state_bytes,
              "seconds_to_read_all_input": round(bulk, 1),
              "new_order_latency_s": {"median": round(statistics.median(lat), 2), "max": round(max(lat), 2),
                                      "all": [round(x, 2) for x in lat]}}
    progress(f"{name}: {result}")
    return result


def publisher_latency(work: Path, markers: int, rounds: int, counts: tuple[int, ...] = (0, 1, 4)) -> dict[str, Any]:
    """One publisher; its batch latency (a new file until the table's next version) with
    each of ``counts`` readers attached in turn, ``rounds`` times, after a warm-up without
    readers (a new driver's first batches are slower: in one run 1.83 s without readers at
    the start against 1.23 s at the end). Each sample starts with the readers caught up."""
    inputs, state = work / "lat-orders", work / "lat-state"
    write_orders(inputs, "base.csv", [f"b{i},c{i:07d},a,1" for i in range(1000)])
    table = FilesystemStorage(str(state / "publisher" / "tables" / "customers"))
    log = TableLog(table)
    publisher = Group(spark_app(str(HERE / "publisher.py"), "--orders", str(inputs), "--state",
                                str(state / "publisher"), "--trigger-interval-ms", "200"), work / "lat-publisher.log")
    groups = [publisher]
    wait("the table", groups, lambda: log.exists())
    attached: list[tuple[Group, Path]] = []
    started = 0
    marker = 0
    chance = random.Random(7)
    phases: list[dict[str, Any]] = []
    for wanted in (0, *counts * rounds):
        while len(attached) > wanted:
            stopped, _ = attached.pop()
            stopped.stop()
            groups.remove(stopped)
        while len(attached) < wanted:
            out = work / f"lat-reader-{started}.jsonlines"
            reader = Group(spark_app(str(HERE / "reader.py"), "--publisher-state", str(state / "publisher"),
                                     "--output", str(out), "--state", str(state / f"reader-{started}"),
                                     "--trigger-interval-ms", "200"), work / f"lat-reader-{started}.log")
            started += 1
            attached.append((reader, out))
            groups.append(reader)
            wait("the reader's first output", groups, lambda out=out: contains(out, "c0000999"))
        samples, caught_up = [], []
        for _ in range(markers):
            marker += 1
            before = log.latest()
            name = f"lat{marker}"
            write_orders(inputs, f"{name}.csv", [f"{name},{name},a,1"])
            samples.append(wait("the next version", groups, poll_s=0.01,
                                done=lambda before=before: (log.latest() or 0) > (before or 0) and any(
                                    log.commit(v).data_change for v in range((before or 0) + 1, log.latest() + 1))))
            # Each sample starts with the readers caught up and idle (polling the table):
            # it measures what attached readers cost the publisher, not two cores shared by
            # five drivers' batches at once (that is the readers' lag, reported beside it).
            caught_up.append(wait("the readers' output", groups,
                                  lambda name=name: all(contains(out, name) for _, out in attached)))
            # Not in step with the publisher's 200 ms trigger.
            time.sleep(1 + chance.uniform(0, 0.2))
        phases.append({"readers": wanted, "warm_up": not phases, "median_s": round(statistics.median(samples), 3),
                       "all": [round(x, 3) for x in samples],
                       "readers_caught_up_after_s": [round(x, 3) for x in caught_up] if wanted else None})
        progress(f"publisher latency with {wanted} readers{' (warm-up)' if phases[-1]['warm_up'] else ''}: {phases[-1]}")
    for g in groups:
        g.stop()
    def measured(n: int) -> list[dict[str, Any]]:
        return [p for p in phases if p["readers"] == n and not p["warm_up"]]

    base = statistics.median(x for p in measured(0) for x in p["all"])
    by_count = {}
    for n in counts:
        pooled = statistics.median(x for p in measured(n) for x in p["all"])
        by_count[str(n)] = {"median_s": round(pooled, 3), "samples": sum(len(p["all"]) for p in measured(n)),
                            "ratio_to_0": round(pooled / base, 3),
                            "ratios_by_round": [round(p["median_s"] / q["median_s"], 3)
                                                for p, q in zip(measured(n), measured(0), strict=True)]}
    return {"by_readers": by_count, "phases": phases}


def recompute_variant(work: Path, markers: int, steady: list[list[str]], limit: list[str]) -> dict[str, Any]:
    """(a): three pipelines, each recomputing the aggregate from the raw orders."""
    return variant(
        "a-recompute", work, work / "orders",
        [(f"recompute-{i}", spark_app(str(HERE / "recompute.py"), "--orders", str(work / "orders"), "--output",
                                      str(work / f"out-{i}.jsonlines"), "--state", str(work / "state" / f"p{i}"), *limit))
         for i in range(3)],
        [work / f"out-{i}.jsonlines" for i in range(3)], [work / "state" / f"p{i}" for i in range(3)],
        "zz-sentinel", markers, steady)


def shared_variant(work: Path, markers: int, steady: list[list[str]], limit: list[str]) -> dict[str, Any]:
    """(b): one publisher of the aggregate and three readers of its changes."""
    publisher_state = work / "state" / "publisher"
    table_log = TableLog(FilesystemStorage(str(publisher_state / "tables" / "customers")))
    return variant(
        "b-shared", work, work / "orders",
        [("publisher", spark_app(str(HERE / "publisher.py"), "--orders", str(work / "orders"), "--state",
                                 str(publisher_state), *limit))] +
        [(f"reader-{i}", spark_app(str(HERE / "reader.py"), "--publisher-state", str(publisher_state),
                                   "--output", str(work / f"out-{i}.jsonlines"), "--state",
                                   str(work / "state" / f"r{i}"))) for i in range(3)],
        [work / f"out-{i}.jsonlines" for i in range(3)],
        [publisher_state, *(work / "state" / f"r{i}" for i in range(3))], "zz-sentinel",
        markers, steady, first_ready=table_log.exists, versions=table_log.latest)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--customers", type=int, default=20000)
    parser.add_argument("--steady-rows", type=int,
                        help="orders per file of the steady phase (as many files as --files; default --rows)")
    parser.add_argument("--max-bytes-per-trigger", type=int,
                        help="the orders' bytes per batch, of the publisher and the recomputing pipelines "
                             "(default spark_app's: 128 MiB)")
    parser.add_argument("--markers", type=int, default=5)
    parser.add_argument("--latency-markers", type=int, default=8)
    parser.add_argument("--latency-rounds", type=int, default=2,
                        help="rounds of 0, 1 and 4 readers for the publisher's latency, after a warm-up (0: none)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="pairs of (a) and (b), their order alternating; 0: the publisher's latency alone")
    parser.add_argument("--keep", action="store_true", help="keep the working folder")
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-shared-"))
    chance = random.Random(21)
    try:
        # The same input for both variants; the last file names a sentinel customer.
        files = [orders(f, options.rows, options.customers, chance) for f in range(options.files)]
        files[-1].append("sentinel,zz-sentinel,a,1")
        steady_rows = options.steady_rows or options.rows
        steady = [orders(options.files + f, steady_rows, options.customers, chance) for f in range(options.files)]
        steady[-1].append(f"steady-sentinel,{STEADY_SENTINEL},a,1")
        limit = ["--max-bytes-per-trigger", str(options.max_bytes_per_trigger)] if options.max_bytes_per_trigger else []
        pairs: list[dict[str, Any]] = []
        for repeat in range(options.repeats):
            progress(f"pair {repeat + 1} of {options.repeats}")
            runs: dict[str, dict[str, Any]] = {}
            # Alternating which goes first: a machine that drifts favours neither.
            for name in ("a", "b") if repeat % 2 == 0 else ("b", "a"):
                folder = work / f"{name}{repeat}"
                for f, rows in enumerate(files):
                    write_orders(folder / "orders", f"part-{f:04d}.csv", rows)
                runs[name] = (recompute_variant if name == "a" else shared_variant)(folder, options.markers, steady,
                                                                                     limit)
                if not options.keep:
                    shutil.rmtree(folder, ignore_errors=True)
            a, b = runs["a"], runs["b"]
            pairs.append({"a_three_recomputing_pipelines": a, "b_publisher_and_three_readers": b, "ratios": {
                "cpu_b_over_a": round(b["cpu_seconds"] / a["cpu_seconds"], 3),
                "steady_cpu_b_over_a": round(b["steady"]["cpu_seconds"] / a["steady"]["cpu_seconds"], 3),
                "cpu_without_jit_b_over_a": round((b["cpu_seconds"] - b["jit_cpu_seconds"])
                                                  / (a["cpu_seconds"] - a["jit_cpu_seconds"]), 3),
                "state_b_over_a": round(b["state_bytes"] / a["state_bytes"], 3),
                "latency_b_over_a": round(b["new_order_latency_s"]["median"] / a["new_order_latency_s"]["median"], 3)}})
            progress(f"pair {repeat + 1}: {pairs[-1]['ratios']}")
        ratios = {key: spread([p["ratios"][key] for p in pairs]) for key in pairs[0]["ratios"]} if pairs else {}
        progress(f"ratios over {len(pairs)} pairs: {ratios}")
        (work / "c").mkdir()
        publisher = (publisher_latency(work / "c", options.latency_markers, options.latency_rounds)
                     if options.latency_rounds else None)
        write_results("shared", {
            "workload": {"files": options.files, "rows_per_file": options.rows, "customers": options.customers,
                         "steady_rows_per_file": steady_rows, "max_bytes_per_trigger": options.max_bytes_per_trigger,
                         "repeats": options.repeats},
            "ratios": ratios, "pairs": pairs,
            "goals": {"cpu_b_over_a": "<= 0.5", "state_b_over_a": "<= 0.4", "publisher_latency_ratio": "<= 1.05"},
            "publisher_batch_latency_by_readers": publisher})
    finally:
        if not options.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
