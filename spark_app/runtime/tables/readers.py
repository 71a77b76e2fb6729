"""A reader's holds on the shared tables it reads.

Before any of its queries starts, a reader registers a hold on each table: at the
version its last commit says it needs (a restart), or at the latest version (a first
start, which reads a snapshot at least that new). After each commit the hold moves to
what that commit says: for a changelog, the version its batch started at (a driver
killed before Spark's own commit of the batch has the next one replay it from there;
the next batch is planned only once Spark has committed this one), and nothing moves it
past a query's start until every query that reads the table has committed; a lookup's
version read; a backfill's version its last committed plan reached
(``backfill_needed``). So the hold is always at or below what the reader may still need,
whatever moment it dies at.

A reader refuses to start (``HoldBroken``, exit code EXIT_TABLE_VERSIONS_GONE) when it
needs a version that the publisher no longer keeps: its hold was broken for being too
old, or released. A lookup never needs history (it reads the latest version at each
batch), so it only warns and holds afresh. A running reader whose hold gets broken stops
at its next commit, with the same message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_app.runtime.tables.location import TableLocation
from spark_app.state.delta_log import TableLog
from spark_app.state.records import QueryHead
from spark_app.state.tables import (
    BACKFILL,
    CHANGELOG,
    LOOKUP,
    Broken,
    ChangelogPosition,
    Hold,
    HoldBroken,
    HoldRegistry,
    LookupPosition,
    ReaderId,
)

log = logging.getLogger("spark_app")


@dataclass(frozen=True)
class TableInput:
    """A table a pipeline reads, as declared (spark_app.io.tables)."""

    persistent_id: str
    kind: str
    """CHANGELOG, BACKFILL or LOOKUP."""
    location: TableLocation


PlanVersions = Callable[[int], "int | None"]
"""The table version a backfill's stored plan of that number reached; None if it is not stored."""


class PlanMissing(Exception):
    """A committed plan of a backfill is not in the reader's state (it was changed by hand)."""


def backfill_needed(committed_plans: int, plan_version: PlanVersions) -> int | None:
    """The oldest table version a backfilling reader may still need, once its queries have
    committed ``committed_plans`` plans: the version the last of them reached. Why that is
    enough: every plan is stored before it is read and kept until committed, so a replay
    reads stored rows, not the table; and a restarted planner carries on from the newest
    stored plan (at or after the committed one), reading only versions after it.

    Before any commit, the first stored plan's version (the first start's hold, at the
    then latest version, is at or below it); None before the first plan: a first start,
    which holds the latest version (the first plan reads one at least as new)."""
    number = max(committed_plans, 1)
    version = plan_version(number)
    if version is None and committed_plans > 0:
        raise PlanMissing(f"plan {committed_plans} is committed but not stored in the reader's state; it is removed "
                          "only once a later one is committed, so the state was changed by hand")
    return version


class TableMissing(Exception):
    """A table a reader declares does not exist (yet)."""


class Readers:
    def __init__(self, inputs: Mapping[str, TableInput], owner: str, state_id: str, reset_hint: str,
                 plans: Mapping[str, PlanVersions] | None = None, clock: Callable[[], float] = time.time) -> None:
        self._inputs = dict(inputs)
        self._plans = dict(plans or {})
        """Per BACKFILL input, where its stored plans say which version each reached."""
        self._state_id = state_id
        self._hint = reset_hint
        self._clock = clock
        self._ids = {pid: ReaderId.for_pipeline(owner, pid, state_id) for pid in inputs}
        self._registries = {pid: HoldRegistry(i.location.storage) for pid, i in inputs.items()}
        self._needed: dict[str, dict[str, int]] = {}
        """Per input, the version each query that reads it still needs (the hold is the lowest)."""
        self._ends: dict[str, dict[str, int]] = {}
        """Per changelog input, the version each query's last commit reached: where its next
        batch starts, and so what it needs once that batch is committed and Spark's too."""

    @property
    def inputs(self) -> Mapping[str, TableInput]:
        return self._inputs

    def open(self, heads: Mapping[str, QueryHead], planned: Mapping[str, Mapping[str, Any]] | None = None,
             reads: Mapping[str, Iterable[str]] | None = None, settled: Iterable[str] = ()) -> None:
        """Registers every hold; raises ``HoldBroken`` for a table that lost what this reader needs.

        ``planned``: per query that has committed no batch, the offsets of the first batch a
        killed driver planned in Spark's offset log, by persistent id. Spark replays that
        plan as it is, so a changelog holds the version it reads, not the latest.
        ``reads``: the persistent ids of the tables each query reads; a changelog's hold
        stays at the start's until every query that reads it has committed a batch.
        ``settled``: the queries whose last committed batch Spark has committed too (its
        commit log has it), which no replay reads again."""
        settled = set(settled)
        for pid, table in self._inputs.items():
            if table.kind == LOOKUP:
                self._open_lookup(pid)
            elif table.kind == BACKFILL:
                committed = {q: int(h.offsets[pid].get("plans", 0)) for q, h in heads.items() if pid in h.offsets}
                positions = {q: backfill_needed(n, self._plans[pid]) for q, n in committed.items()}
                # Plans written before a kill that came before any commit: the planner carries on from them.
                pending = backfill_needed(0, self._plans[pid]) if not committed else None
                self._open_changelog(pid, {q: v for q, v in positions.items() if v is not None}, pending)
            else:
                ends = _positions(pid, heads)
                self._ends[pid] = dict(ends)
                reached = {**_planned_positions(pid, planned or {}), **ends}
                # A query whose last batch Spark had not committed (its driver was killed in
                # between) replays it from where it started, which the stored hold still is.
                started = self._stored_version(pid)
                if started is not None:
                    reached = {q: v if q in settled else min(v, started) for q, v in reached.items()}
                held = self._open_changelog(pid, reached)
                needed = self._needed.setdefault(pid, {})
                for query in (q for q, pids in (reads or {}).items() if pid in pids):
                    needed.setdefault(query, held)  # its first batch starts at or after it

    def _open_changelog(self, pid: str, positions: dict[str, int], pending: int | None = None) -> int:
        """Registers the hold of a changelog or a backfill at the lowest of ``positions`` and
        ``pending`` (the latest version if there are none); returns the version held."""
        registry, reader, table = self._registries[pid], self._ids[pid], self._inputs[pid]
        broken = registry.broken(reader)
        if not positions and pending is None:
            if broken is not None:
                registry.clear_broken(reader)  # a predecessor's, before this state was reset
            latest = self._latest(pid)
            self._put(pid, latest, latest)
            log.info("table %s: %s holds version %d (first start: it reads the table's contents, then its changes)",
                     table.location.ref, reader, latest)
            return latest
        self._needed[pid] = dict(positions)
        needed = min([*positions.values(), *([] if pending is None else [pending])])
        if broken is not None and broken.state_id == self._state_id:
            raise self._gone(pid, needed, broken.reason, broken_hold=True)
        if broken is not None:
            registry.clear_broken(reader)
        self._put(pid, needed, self._next(pid, needed))
        frontier = registry.frontier()
        if frontier is not None and needed < frontier.version:
            # What it needs is gone: its hold would only keep compaction at the frontier for good.
            registry.release(reader)
            raise self._gone(pid, needed, "", broken_hold=False)
        log.info("table %s: %s holds version %d (resumed)", table.location.ref, reader, needed)
        return needed

    def _stored_version(self, pid: str) -> int | None:
        """The version this reader's stored hold is at; None if it has none, or one that is
        broken or of another state of the reader."""
        registry, reader = self._registries[pid], self._ids[pid]
        stored = registry.hold(reader)
        if stored is None or stored.state_id != self._state_id or registry.broken(reader) is not None:
            return None
        return stored.version

    def _open_lookup(self, pid: str) -> None:
        registry, reader = self._registries[pid], self._ids[pid]
        if registry.broken(reader) is not None:
            log.warning("table %s: the hold of lookup %s had been broken; a lookup reads the latest version "
                        "anyway, so it holds afresh", self._inputs[pid].location.ref, reader)
            registry.clear_broken(reader)
        latest = self._latest(pid)
        self._put(pid, latest, latest + 1)

    def committed(self, query: str, head: QueryHead, pids: Iterable[str]) -> None:
        """Moves the holds of a query's inputs to what its new commit needs; raises
        ``HoldBroken`` if the publisher broke one meanwhile (the commit stands: what it
        read was there)."""
        for pid in pids:
            table = self._inputs.get(pid)
            offset = head.offsets.get(pid)
            if table is None or offset is None:
                continue
            version = self._needed_after(table.kind, pid, offset)
            if version is None:
                continue  # a backfill with no plan read yet, a lookup with no version read: the hold stands
            needed = self._needed.setdefault(pid, {})
            if table.kind == CHANGELOG:
                # Held at where this batch started until the next one commits: a driver killed
                # before Spark's own commit of this batch has the next one replay it from there.
                ends = self._ends.setdefault(pid, {})
                started = ends.get(query, needed.get(query, version))  # a first commit: what open held
                ends[query] = version
                version = min(started, version)
            needed[query] = version
            if table.kind != LOOKUP:  # a lookup never needs history, so a broken hold does not stop it
                broken = self._registries[pid].broken(self._ids[pid])
                if broken is not None and broken.state_id == self._state_id:
                    raise self._gone(pid, version, broken.reason, broken_hold=True)
            lowest = min(needed.values())
            self._put(pid, lowest, self._next(pid, lowest))

    def settled(self, query: str) -> None:
        """Spark has committed the query's last committed batch too (a clean stop's queries
        have ended), so no replay reads from where it started: its changelogs' holds move to
        where it ended."""
        for pid, ends in self._ends.items():
            needed = self._needed.get(pid, {})
            if query in ends and query in needed and needed[query] < ends[query]:
                needed[query] = ends[query]
                lowest = min(needed.values())
                self._put(pid, lowest, self._next(pid, lowest))

    def _needed_after(self, kind: str, pid: str, offset: dict[str, Any]) -> int | None:
        """The oldest version a query still needs once it committed ``offset``."""
        if kind == CHANGELOG:
            return ChangelogPosition.from_offset(offset).needed
        if kind == BACKFILL:
            return backfill_needed(int(offset.get("plans", 0)), self._plans[pid])
        position = LookupPosition.from_offset(offset)
        return None if position is None else position.version

    def refresh_lookups(self, busy: Callable[[], bool]) -> None:
        """Moves idle lookups' holds to the latest version, so that a lookup whose stream is
        quiet does not hold the table back: the latest version is read before checking
        that no batch runs, and a batch planned after the check reads one at least as new."""
        for pid, table in self._inputs.items():
            if table.kind != LOOKUP:
                continue
            latest = TableLog(table.location.storage).latest()
            if latest is None or busy():
                continue
            self._needed.pop(pid, None)
            self._put(pid, latest, latest + 1)

    def _next(self, pid: str, version: int) -> int:
        """A hold's first unconsumed version (Hold.next) when it needs ``version``: a lookup
        or a backfill has read that version; a changelog has read up to where its slowest
        query's last commit reached (it holds where that batch started)."""
        kind = self._inputs[pid].kind
        if kind != CHANGELOG:
            return version + 1
        ends = self._ends.get(pid, {})
        return min([ends.get(q, v) for q, v in self._needed.get(pid, {}).items()] or [version])

    def _put(self, pid: str, version: int, next_version: int) -> None:
        self._registries[pid].put(Hold(self._ids[pid], self._inputs[pid].kind, version, next_version,
                                       self._state_id, int(self._clock() * 1000)))

    def _latest(self, pid: str) -> int:
        table = self._inputs[pid]
        latest = TableLog(table.location.storage).latest()
        if latest is None:
            raise TableMissing(f"table {table.location.ref} does not exist at {table.location.uri} (its "
                               "publisher has not committed a batch yet)")
        return latest

    def _gone(self, pid: str, needed: int, reason: str, broken_hold: bool) -> HoldBroken:
        registry = self._registries[pid]
        frontier = registry.frontier()
        broken = registry.broken(self._ids[pid]) if broken_hold else None
        if broken_hold and broken is None:
            broken = Broken(self._ids[pid], self._state_id, needed, 0, reason)
        return HoldBroken(str(self._inputs[pid].location.ref), self._ids[pid], needed,
                          frontier.version if frontier else None, broken, self._hint)


def _positions(pid: str, heads: Mapping[str, QueryHead]) -> dict[str, int]:
    """The version each query that has committed a position in a changelog still needs."""
    return {query: ChangelogPosition.from_offset(head.offsets[pid]).needed
            for query, head in heads.items() if pid in head.offsets}


def _planned_positions(pid: str, planned: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """The version each query that has planned, and not committed, its first batch in a
    changelog needs for it."""
    return {query: ChangelogPosition.from_offset(dict(offsets[pid])).needed
            for query, offsets in planned.items() if pid in offsets}
