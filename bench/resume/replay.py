"""A keyed output's changelog replay, alone: what a restart does with the lines written
after the output's last committed snapshot (a driver killed after a large batch, before
the snapshot that covers it was committed).

A state of --keys keys (as restored from a snapshot), then --lines changelog lines of
updates to random keys (each update a -1 line of the old row and a +1 line of the new,
batches of 50,000 lines sharing their time), replayed with OutputState.apply_changelog;
the replay alone is timed, --rounds times, each on a fresh state. It needs no Spark.

    .venv/bin/python bench/resume/replay.py [--keys 1000000 --lines 1100000 --rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import progress, write_results  # noqa: E402
from spark_app.runtime.sinks.keyed_state import OutputState  # noqa: E402

BATCH_LINES = 50_000


def changelog(keys: int, lines: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(0, lines, 2):
        key = f"k{rng.randrange(keys):09d}"
        time_ms = 1_764_000_000_000 + i // BATCH_LINES
        out.append(f'{{"word":"{key}","count":{rng.randrange(100)},"time":{time_ms},"diff":-1}}\n'.encode())
        out.append(f'{{"word":"{key}","count":{rng.randrange(100)},"time":{time_ms},"diff":1}}\n'.encode())
    return out


def replay_once(keys: int, lines: list[bytes]) -> tuple[float, int]:
    state = OutputState(["word"])
    try:
        state.begin()
        state.upsert((f'["k{i:09d}"]', f'{{"word":"k{i:09d}","count":0}}') for i in range(keys))
        state.commit()
        began = time.perf_counter()
        state.apply_changelog(lines)
        return time.perf_counter() - began, len(state)
    finally:
        state.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--lines", type=int, default=1_100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    lines = changelog(args.keys, args.lines)
    seconds = []
    for number in range(args.rounds):
        took, kept = replay_once(args.keys, lines)
        seconds.append(took)
        progress(f"replay {number + 1}/{args.rounds}: {len(lines):,} lines in {took:.2f} s "
                 f"({len(lines) / took:,.0f} lines/s), {kept:,} keys")
    median = statistics.median(seconds)
    write_results("replay", {"keys": args.keys, "lines": len(lines), "seconds": [round(s, 3) for s in seconds],
                             "median_s": round(median, 3), "lines_per_s": round(len(lines) / median)})


if __name__ == "__main__":
    main()
