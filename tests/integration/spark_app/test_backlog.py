"""A backlog drains in bounded batches, with the driver's memory bounded.

After an outage the input waiting can be many times what one batch should hold. Each
batch takes at most max_files/max_bytes per trigger, so the backlog drains in several
batches; the outputs stream each batch to storage instead of holding it in the driver.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.integration.spark_app.harness import Workspace, fold, read_changelog, spark_conf_env

pytestmark = pytest.mark.spark

LIMIT = 1 << 20  # bytes per trigger
FILES = 84
ROWS_PER_FILE = 25_000  # about 260 KiB each: four files a batch, a backlog of 21 x the limit


def write_backlog(folder) -> dict[str, int]:  # type: ignore[no-untyped-def]
    folder.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for f in range(FILES):
        lines = ["word,n"]
        for i in range(ROWS_PER_FILE):
            word = f"w{(f * 31 + i) % 997}"
            counts[word] = counts.get(word, 0) + 1
            lines.append(f"{word},{i}")
        (folder / f".part-{f:03d}.csv").write_text("\n".join(lines) + "\n")
        os.rename(folder / f".part-{f:03d}.csv", folder / f"part-{f:03d}.csv")
    return counts


def test_a_backlog_of_twenty_batches_drains_in_bounded_batches(fs_workspace: Workspace) -> None:
    counts = write_backlog(fs_workspace.inputs)
    backlog = sum(p.stat().st_size for p in fs_workspace.inputs.iterdir())
    assert backlog >= 20 * LIMIT
    driver = fs_workspace.driver(
        "--stop-when-idle", "--max-bytes-per-trigger", str(LIMIT),
        env=spark_conf_env(**{"spark.driver.memory": "1g"}),
    ).start()
    peak = 0
    peaks: dict[str, int] = {}
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            now = driver.memory_bytes()
            peak = max(peak, sum(now.values()))
            for name, rss in now.items():
                peaks[name] = max(peaks.get(name, 0), rss)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        assert driver.wait(600) == 0, driver.output()[-3000:]
    finally:
        done.set()
        sampler.join()
    batches = driver.count_in_output("query counts_jsonlines: committed batch")
    print(f"backlog {backlog / 2**20:.1f} MiB in {batches} batches; peak memory (PSS) of the driver's processes "
          f"together {peak / 2**20:.0f} MiB; each: " +
          ", ".join(f"{name} {rss / 2**20:.0f} MiB" for name, rss in sorted(peaks.items()) if rss >= 2**20))
    assert batches >= 20
    table = fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",))
    assert {k[0]: v["count"] for k, v in table.items()} == counts
    # A 1 GiB driver heap, Spark's Python workers and the driver's Python: within a 2 GiB pod.
    assert peak < 2 * 2**30
