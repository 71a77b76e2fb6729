"""Backfill: reading a keyed, versioned table from its start while following its changes.

A reader that starts on a table with millions of rows cannot take them as one batch, and
must not make live changes wait for all of them. The table is read in key order, a chunk
at a time, and each step of the reader is a *plan*: the table's changes since the last
plan for the keys already read, then the next chunk of keys, read at the table's newest
version. Changes to keys not read yet are not forwarded: those rows will be read later,
with the changes applied. So after every plan, the rows handed over so far, folded with
their diffs, are exactly the table at the plan's version for the keys up to the position.
Once the last chunk is read, the position is past every key and each plan is just the
table's changes.

This module is the algebra, over any ``TableView`` (a Delta table in
spark_app.runtime.sources.delta_table, a dictionary in the tests). Plans are written
durably one after another by a single planner (spark_app.runtime.sources.delta_table),
each carrying the ``Frontier`` it reaches; a planner that restarts carries on from the
newest plan, so a reader killed anywhere re-reads at most the plans it had not committed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

R = TypeVar("R")
"""The rows of a plan: an Arrow table in the runtime, a list in the tests."""


@dataclass(frozen=True)
class Position:
    """How far the key-ordered read has got: before every key, after ``key`` (encoded by
    the table view; opaque here), or past every key (the backfill is finished)."""

    key: str | None = None
    finished: bool = False

    @property
    def started(self) -> bool:
        return self.finished or self.key is not None


START = Position()
END = Position(finished=True)


@dataclass(frozen=True)
class Frontier:
    """Where the backfill stands after plan number ``plans``; stored in that plan."""

    plans: int = 0
    """Plans written so far (the newest one's number)."""
    version: int | None = None
    """The table version the rows handed over correspond to; None before the first plan."""
    position: Position = START
    rows_read: int = 0
    """Rows of the table read in chunks."""
    remaining: int = 0
    """Rows of keys after the position at ``version``: what is left to read."""
    started_ms: int = 0
    finished_ms: int | None = None

    @property
    def finished(self) -> bool:
        return self.position.finished

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Frontier:
        value: dict[str, Any] = json.loads(text)
        return cls(**{**value, "position": Position(**value["position"])})


@dataclass(frozen=True)
class Changes(Generic[R]):
    forwarded: R
    """The changes to keys at or before the position, each with its diff."""
    count: int
    """How many rows ``forwarded`` holds."""
    beyond: int
    """The net number of rows the changes add after the position (inserts minus deletes)."""


@dataclass(frozen=True)
class Chunk(Generic[R]):
    rows: R
    """Rows of keys after a position, in key order, each with diff +1."""
    count: int
    last: str | None
    """The last key read, encoded; None when the chunk is empty."""


@dataclass(frozen=True)
class Behind:
    """Keys after a position and up to ``up_to``, read as a chunk at ``version``, a version
    older than the changes being read: their changes since that version go with them."""

    version: int
    up_to: Position


class TableView(Protocol[R]):
    """A keyed table with numbered versions and a record of the changes between them."""

    def latest_version(self) -> int: ...

    def changes(self, after: int, through: int, position: Position, behind: Behind | None = None) -> Changes[R]:
        """The changes of versions ``after`` + 1 to ``through``, split at ``position``. With
        ``behind``, also those of versions ``behind.version`` + 1 to ``through`` for keys
        after ``position`` up to ``behind.up_to``; ``beyond`` then counts what the changes
        add after ``position`` less what they add up to ``behind.up_to``, so that it stays
        what is left to read once that chunk is handed over."""

    def chunk(self, version: int, position: Position, limit: int) -> Chunk[R]:
        """Up to ``limit`` rows with keys after ``position``, as of ``version``, in key order."""

    def count(self, version: int, position: Position) -> int:
        """How many rows have keys after ``position``, as of ``version``."""

    def concat(self, parts: Sequence[R]) -> R: ...


@dataclass(frozen=True)
class Plan(Generic[R]):
    frontier: Frontier
    rows: R
    changes: int
    """How many of the rows are forwarded changes; the others are the chunk's."""
    chunk: int


@dataclass(frozen=True)
class FileRange:
    """One data file of a table, from its statistics: its rows and the least and greatest
    value of the first key column in it (None where not recorded)."""

    rows: int
    low: Any
    high: Any


def chunk_bound(files: Sequence[FileRange], after: Any, limit: int) -> Any | None:
    """An upper bound on the first key column for the next chunk after ``after`` (None:
    from the start): the least value at which the files wholly after ``after`` and wholly
    at or below it hold ``limit`` rows. Reading keys at or below it cannot miss any of the
    next ``limit`` keys, and lets the scan skip every file above it. None when no such
    value is known (a file without statistics, or too few rows): read to the end.

    Files straddling ``after`` are not counted (some of their rows are before it), and a
    file's count may include rows deleted since (deletion vectors): the caller checks that
    the chunk came back full and reads without the bound when not."""
    if any(f.low is None or f.high is None for f in files):
        return None
    counted = sorted((f.high, f.rows) for f in files if after is None or f.low > after)
    total = 0
    for high, rows in counted:
        total += rows
        if total >= limit:
            return high
    return None


@dataclass(frozen=True)
class ReadAhead(Generic[R]):
    """A chunk read while plans of changes went on: at ``version``, of up to ``limit`` keys
    after ``after``. Plans of changes leave the position where it is, so the chunk still
    starts there when it is handed over; what changed since ``version`` goes with it."""

    version: int
    after: Position
    limit: int
    chunk: Chunk[R]

    def fits(self, frontier: Frontier) -> bool:
        """Whether it can be handed over after ``frontier``: read from its position, at a
        version it had reached (not so after another driver's plans were taken over)."""
        return (not frontier.finished and frontier.version is not None and frontier.position == self.after
                and self.version <= frontier.version)


class TableRewound(Exception):
    """The table's newest version is older than one already read: it was replaced or restored."""


def next_plan(frontier: Frontier, view: TableView[R], budget: int, now_ms: int | None = None,
              ahead: ReadAhead[R] | None = None) -> Plan[R] | None:
    """The plan after ``frontier``, reading a chunk of at most ``budget`` rows (0: changes
    only, the backfill paused), or None when there is nothing to hand over. With ``ahead``
    (which must fit the frontier), that chunk is handed over instead of reading one, with
    the changes of its keys since it was read."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    latest = view.latest_version()
    if ahead is not None:
        assert ahead.fits(frontier), (ahead.version, ahead.after, frontier)
        budget = ahead.limit
    reading = not frontier.finished and budget > 0
    if frontier.version is None:
        changes: Changes[R] | None = None
        remaining = view.count(latest, START)
        start = replace(frontier, started_ms=now_ms)
    else:
        if latest < frontier.version:
            raise TableRewound(f"the table's newest version is {latest}, but version {frontier.version} was read "
                               "already: the table was replaced or restored to an older version")
        if latest == frontier.version and not reading:
            return None
        changes = None
        if ahead is not None and latest > ahead.version:
            up_to = _past(ahead.chunk, ahead.limit)
            changes = view.changes(frontier.version, latest, frontier.position, Behind(ahead.version, up_to))
        elif latest > frontier.version:
            changes = view.changes(frontier.version, latest, frontier.position)
        remaining = frontier.remaining + (changes.beyond if changes else 0)
        start = frontier
    chunk = ahead.chunk if ahead is not None else view.chunk(latest, frontier.position, budget) if reading else None
    read = chunk.count if chunk else 0
    finished = frontier.finished or (chunk is not None and read < budget)
    position = END if finished else _past(chunk, budget) if chunk is not None else frontier.position
    read_rows = [chunk.rows] if chunk else []
    changed_rows = [changes.forwarded] if changes else []
    # A chunk read ahead comes first, the changes of its keys since it was read after it. A
    # chunk read now is as of the changes' version, and they are of keys before its own.
    parts = read_rows + changed_rows if ahead is not None else changed_rows + read_rows
    return Plan(
        frontier=replace(
            start,
            plans=frontier.plans + 1,
            version=latest,
            position=position,
            rows_read=frontier.rows_read + read,
            remaining=0 if finished else remaining - read,
            finished_ms=start.finished_ms or (now_ms if finished else None),
        ),
        rows=view.concat(parts),
        changes=changes.count if changes else 0,
        chunk=read,
    )


def _past(chunk: Chunk[R], limit: int) -> Position:
    """The position after a chunk read with ``limit``: past every key when it came back
    short, else at its last key."""
    if chunk.count < limit or chunk.last is None:
        return END
    return Position(chunk.last)


class TokenBucket:
    """Rows per second for the chunks, changeable while running; None is unlimited, 0 pauses.

    Unused allowance is saved, so that a read slower than the limit is made up by the next
    ones; but no more than ``saved_s`` seconds of the rate (never less than ``least`` rows,
    a chunk, which must fit, nor more than ``most``). Over any window of W seconds the rows
    taken exceed the limit by at most what was saved, so the savings bound the overshoot to
    saved_s / W: two chunks saved at every rate let a low limit run 11.5% over a minute."""

    def __init__(self, rows_per_second: float | None, least: int, most: int, saved_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 1 <= least <= most:
            raise ValueError(f"the savings must hold at least 1 row and least <= most, got {least} and {most}")
        self._rate = rows_per_second
        self._least, self._most, self._saved_s = least, most, saved_s
        self._clock = clock
        self._tokens = 0.0
        self._at = clock()

    @property
    def capacity(self) -> int:
        """The most allowance saved at the current rate."""
        if not self._rate:
            return self._most
        return min(self._most, max(self._least, int(self._rate * self._saved_s)))

    @property
    def rate(self) -> float | None:
        return self._rate

    def set_rate(self, rows_per_second: float | None) -> None:
        self._refill()
        self._rate = rows_per_second
        if rows_per_second == 0:
            self._tokens = 0.0  # a pause holds at once: what was saved before it is not spent after
        self._tokens = min(self._tokens, float(self.capacity))

    def available(self) -> int:
        self._refill()
        if self._rate == 0:
            return 0
        return self.capacity if self._rate is None else int(self._tokens)

    def reserve(self, most: int) -> int:
        """Takes up to ``most`` rows of the allowance now, before they are read: the read
        takes time, and what accrues meanwhile must go to the next chunk, not overflow a
        bucket still holding this one's (which held 42,400 rows/s at 0.64 of it)."""
        rows = min(most, self.available())
        self._tokens = max(0.0, self._tokens - rows)
        return rows

    def refund(self, rows: int) -> None:
        """Gives back reserved rows that were not read (a last chunk, a plan not written)."""
        self._refill()
        if self._rate != 0:
            self._tokens = min(float(self.capacity), self._tokens + rows)

    def seconds_until(self, rows: int) -> float | None:
        """How long until ``rows`` are available; None while paused."""
        if self._rate is None:
            return 0.0
        if self._rate <= 0:
            return None
        self._refill()
        return max(0.0, (min(rows, self.capacity) - self._tokens) / self._rate)

    def _refill(self) -> None:
        now = self._clock()
        if self._rate is not None:
            self._tokens = min(float(self.capacity), self._tokens + (now - self._at) * self._rate)
        self._at = now


@dataclass(frozen=True)
class Progress:
    """A backfill as its reader reports it."""

    rows_read: int
    rows_total: int
    percent: float
    rows_per_second: float | None
    """Measured over the recent chunks; None before two of them."""
    eta_seconds: float | None
    paused: bool
    finished: bool
    version: int | None


def progress(frontier: Frontier, rows_per_second: float | None, paused: bool) -> Progress:
    total = frontier.rows_read + frontier.remaining
    percent = 100.0 if frontier.finished or total == 0 else round(100.0 * frontier.rows_read / total, 1)
    eta = None
    if not frontier.finished and not paused and rows_per_second:
        eta = round(frontier.remaining / rows_per_second, 1)
    return Progress(frontier.rows_read, total, percent, rows_per_second, eta, paused and not frontier.finished,
                    frontier.finished, frontier.version)


class RateMeter:
    """Rows per second over a sliding window of recent reads."""

    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window_s
        self._clock = clock
        self._samples: list[tuple[float, int]] = []

    def add(self, rows: int) -> None:
        now = self._clock()
        self._samples.append((now, rows))
        self._samples = [(t, n) for t, n in self._samples if now - t <= self._window]

    def rate(self) -> float | None:
        if len(self._samples) < 2:
            return None
        span = self._samples[-1][0] - self._samples[0][0]
        if span <= 0:
            return None
        return round(sum(n for _, n in self._samples[1:]) / span, 1)
