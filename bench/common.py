"""Shared pieces of the benchmarks: where results go, what machine they ran on, and how a
pipeline run is timed. Benchmarks measure; tests assert behaviour (tests/)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SPARK_CONF = {"spark.master": "local[2]", "spark.ui.enabled": "false", "spark.driver.memory": "4g"}


def start_up_conf() -> dict[str, str]:
    """What spark_app's session adds for itself, for a baseline driver to get the same: the
    jars folder (Delta, hadoop-aws, the Kafka connector) on the class path, the JVM's
    recorded class archive (empty when none is recorded), the compiler directives for its
    start-up-only code and RocksDB's unpacked library."""
    from spark_app.runtime.jvm import class_archive, launch
    from spark_app.runtime.jvm.jars import jars_dir

    jars = jars_dir()
    archive = class_archive.archive_path(jars)
    libraries = class_archive.library_path(archive)
    return {"spark.driver.extraClassPath": os.path.join(jars, "*"),
            "spark.driver.defaultJavaOptions": launch.start_up_aids(archive),
            **({"spark.driver.extraLibraryPath": libraries} if libraries else {})}


def baseline_session(app_name: str) -> Any:
    """The SparkSession a baseline word count (no spark_app) runs on: SPARK_APP_SPARK_CONF
    as the benchmark passes it, 4 shuffle partitions, UTC, and the RocksDB state store with
    changelog checkpointing, as spark_app's own session has them."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in json.loads(os.environ.get("SPARK_APP_SPARK_CONF", "{}")).items():
        builder = builder.config(key, value)
    spark = (builder
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
             .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    return spark


def stop_on_sigterm() -> None:
    """SIGTERM ends a benchmark as Ctrl-C does, so that its finally blocks stop the servers
    and drivers it started."""
    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)


def process_cpu_seconds(pid: int) -> float:
    """A live process's own CPU seconds so far (user and system, from /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def progress(message: str) -> None:
    print(f">>> [{time.strftime('%H:%M:%S')}] {message}", flush=True)


def machine() -> dict[str, Any]:
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "java": java[0] if java else "unknown",
        "pyspark": pyspark.__version__,
        "load_average_at_start": [round(x, 2) for x in load],
    }


def write_results(name: str, results: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS / f"{name}-{stamp}.json"
    path.write_text(json.dumps({"benchmark": name, "when": stamp, "machine": machine(), **results}, indent=2) + "\n")
    progress(f"results written to {path.relative_to(REPO)}")
    return path


@dataclass
class Run:
    """One timed driver process."""

    seconds: float
    returncode: int
    log: str


def kill_driver(process: subprocess.Popen[bytes]) -> None:
    """kill -9 of a driver started in a session of its own: Python and its JVM, as a lost
    node or a killed container would. (Killed alone, the Python process left its JVM to run
    Spark's shutdown on its own, beside the next driver's start, and one such JVM hung in it.)"""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_process(args: list[str], log_path: Path, env: dict[str, str] | None = None, until: Any = None,
                timeout: float = 1800, stop_signal: int = signal.SIGTERM, linger: Any = None) -> Run:
    """Runs ``args``; stops when it exits or, with ``until``, as soon as ``until()`` is true
    (the time is taken at that moment; then the process gets ``stop_signal``, once
    ``linger()`` is true too, if given, or 30 s have passed)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPARK_APP_SPARK_CONF": json.dumps(SPARK_CONF),
                "SPARK_APP_TERMINATION_LOG": str(log_path) + ".end", **(env or {})}
    began = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                   start_new_session=True)
    seconds = None
    try:
        while process.poll() is None:
            if until is not None and until():
                seconds = time.monotonic() - began
                lingered = time.monotonic()
                while (linger is not None and not linger() and process.poll() is None
                       and time.monotonic() - lingered < 30):
                    time.sleep(0.1)
                if stop_signal == signal.SIGKILL:
                    kill_driver(process)
                else:  # a stop the driver handles, sent to it alone, as to a container's first process
                    process.send_signal(stop_signal)
                break
            if time.monotonic() - began > timeout:
                raise TimeoutError(f"{args} ran over {timeout}s; see {log_path}")
            time.sleep(0.05)
        process.wait()
    finally:
        if process.poll() is None:  # the benchmark is failing or being stopped: no driver outlives it
            kill_driver(process)
            process.wait()
    if seconds is None:
        seconds = time.monotonic() - began
    return Run(round(seconds, 2), process.returncode, log_path.read_text(errors="replace"))


def spark_app(*args: str) -> list[str]:
    return [sys.executable, "-m", "spark_app", "run", *args]
