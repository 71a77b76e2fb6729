"""Where a driver's start went, phase by phase: logged once per query, when its first
batch is done.

What a user waits for after a driver dies is the time from the new process's start to
its first batch. The line says which part of it was the JVM and the session, opening the
state, restoring the outputs' state, and the first batch itself, with what Spark's state
store reported of loading its state in that batch. ``bench/resume`` reads the line back
with ``parse``; the format lives here only.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_LOAD = "rocksdbLoadLatencyMs"
_REPLAY = "rocksdbReplayChangeLogLatencyMs"
_REPLAYED_FILES = "rocksdbNumReplayChangelogFiles"
_COPIED = "rocksdbBytesCopied"

LINE_PREFIX = "start-up of query "
"""How every start-up line begins."""


def process_started() -> float:
    """The wall-clock time this process started (Linux's /proc; else now)."""
    try:
        with open("/proc/self/stat") as handle:
            # The command name (field 2) may hold spaces; the fields after its ')' do not.
            fields = handle.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/uptime") as handle:
            up = float(handle.read().split()[0])
        # The age from two readings of the same clock (since boot, to a hundredth of a
        # second); /proc/stat's boot time is in whole seconds.
        return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


@dataclass(frozen=True)
class QueryStartup:
    """One query's start, phase by phase, in seconds. A pipeline's queries start one after
    the other, so a later query's phases add up to less than its total."""

    query: str
    total_s: float
    """From the process's start to the end of the query's first batch."""
    declared_s: float
    """From the process's start: the JVM, the SparkSession and the pipeline's declarations."""
    state_s: float
    """Opening the stored state: the lease, the metadata log, checkpoints, planners."""
    recovered_s: float
    """Aligning the query's outputs with the last commit and restoring their state."""
    starting_s: float
    """From starting the Spark query to its first trigger (its sources' start, planning)."""
    batch_s: float
    """The first batch (Spark's triggerExecution), the state store's load included."""
    store_load_s: float | None = None
    """What Spark's state store reported for that batch, summed over its partitions (which
    load in parallel tasks): its whole load, the part that replayed changelog files, how
    many, and the bytes of snapshot files copied from the checkpoint."""
    store_replay_s: float | None = None
    store_replayed_files: int | None = None
    store_copied_bytes: int | None = None

    def describe(self) -> str:
        store = ""
        if self.store_load_s is not None:
            store = (f" (state store: load {self.store_load_s:.2f} s, changelog replay {self.store_replay_s or 0:.2f} s "
                     f"over {self.store_replayed_files or 0} files, {self.store_copied_bytes or 0} bytes copied; "
                     "summed over its partitions)")
        return (f"{LINE_PREFIX}{self.query}: first batch done {self.total_s:.2f} s after the process started: "
                f"JVM, session and declarations {self.declared_s:.2f} s; state opened {self.state_s:.2f} s; "
                f"outputs recovered {self.recovered_s:.2f} s; query started {self.starting_s:.2f} s; "
                f"first batch {self.batch_s:.2f} s{store}")


def from_progress(query: str, process_start: float, declared: float, state: float, recovery: tuple[float, float],
                  progress: Mapping[str, Any]) -> QueryStartup:
    """The start-up of ``query`` from wall-clock moments (the declarations' and the state's
    ends, the query's recovery's start and end) and the query's first progress report."""
    began = _epoch_seconds(progress.get("timestamp")) or time.time()
    metrics: dict[str, float] = {}
    for operator in progress.get("stateOperators") or []:
        for name, value in (operator.get("customMetrics") or {}).items():
            if name in (_LOAD, _REPLAY, _REPLAYED_FILES, _COPIED):
                metrics[name] = metrics.get(name, 0) + float(value)
    store = _LOAD in metrics
    batch_s = float((progress.get("durationMs") or {}).get("triggerExecution", 0)) / 1000
    return QueryStartup(
        query=query,
        total_s=round(began + batch_s - process_start, 3),
        declared_s=round(declared - process_start, 3),
        state_s=round(state - declared, 3),
        recovered_s=round(recovery[1] - recovery[0], 3),
        starting_s=round(max(0.0, began - recovery[1]), 3),
        batch_s=round(batch_s, 3),
        store_load_s=metrics[_LOAD] / 1000 if store else None,
        store_replay_s=metrics.get(_REPLAY, 0) / 1000 if store else None,
        store_replayed_files=int(metrics.get(_REPLAYED_FILES, 0)) if store else None,
        store_copied_bytes=int(metrics.get(_COPIED, 0)) if store else None,
    )


_NUMBER = r"([\d.]+)"
_LINE = re.compile(
    re.escape(LINE_PREFIX) + rf"(\S+): first batch done {_NUMBER} s after the process started: "
    rf"JVM, session and declarations {_NUMBER} s; state opened {_NUMBER} s; outputs recovered {_NUMBER} s; "
    rf"query started {_NUMBER} s; first batch {_NUMBER} s"
    rf"(?: \(state store: load {_NUMBER} s, changelog replay {_NUMBER} s over (\d+) files, (\d+) bytes copied)?"
)


def parse(text: str) -> list[QueryStartup]:
    """Every start-up line of a driver's log, in order."""
    found = []
    for match in _LINE.finditer(text):
        query, total, declared, state, recovered, starting, batch, load, replay, files, copied = match.groups()
        found.append(QueryStartup(
            query, float(total), float(declared), float(state), float(recovered), float(starting), float(batch),
            store_load_s=float(load) if load is not None else None,
            store_replay_s=float(replay) if replay is not None else None,
            store_replayed_files=int(files) if files is not None else None,
            store_copied_bytes=int(copied) if copied is not None else None,
        ))
    return found


def _epoch_seconds(timestamp: Any) -> float | None:
    """Spark's progress timestamp (ISO 8601 in UTC, with milliseconds) as epoch seconds."""
    if not isinstance(timestamp, str):
        return None
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
