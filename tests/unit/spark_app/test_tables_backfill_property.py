"""A shared table read with the keyed backfill, over random schedules of the publisher's
commits and compactions, the planner's plans and the reader's batches and kills, against a
plain recomputation. The holds (Readers, HoldRegistry), the compaction's frontier
(spark_app.state.compaction.frontier) and the plans (next_plan) are the real ones; the
table and the reader's state are models:

* the publisher: a table with every version's rows and changes, committing upserts and
  deletes of small int keys; its compaction records the frontier of the live holds (no
  time margin) and forgets every version below it, so that reading one raises ``Compacted``;
* the reader: its stored plans, how many it committed, and its output, the rows of the
  committed plans only (an exactly-once sink: a kill during a batch is a kill before it).
  Its planner writes a plan while fewer than LOOKAHEAD are uncommitted; a batch reads the
  next stored plans, commits them, then moves the hold. The restarted driver opens its
  holds from its last commit, and its planner carries on from the newest stored plan.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_app.persistence import Backend
from spark_app.runtime.sources.backfill import Frontier, Plan, ReadAhead, next_plan
from spark_app.runtime.sources.delta_table import BackfillSettings
from spark_app.runtime.tables.location import TableLocation
from spark_app.runtime.tables.readers import Readers, TableInput
from spark_app.state.compaction import frontier
from spark_app.state.delta_log import commit_key
from spark_app.state.records import QueryHead
from spark_app.state.tables import BACKFILL, Hold, HoldRegistry, ReaderId, TableRef
from spark_app.state.tables import Frontier as Kept
from spark_app.storage import FilesystemStorage
from tests.support.keyed_table import DictTable, Row, fold

LOOKAHEAD = BackfillSettings().lookahead
EXAMPLES = int(os.environ.get("BACKFILL_HOLD_EXAMPLES", "200"))
MEMORY = "/dev/shm" if os.path.isdir("/dev/shm") else None
"""Where the tables' folders go: FilesystemStorage fsyncs every write, which on a disk
makes the test about ten times slower."""
PID = "customers"
QUERY = "tiers"
READER = ReaderId("shop", "tiers", PID)


class Compacted(Exception):
    """A read of a version the publisher's compaction removed."""


class PublishedTable(DictTable):
    """The publisher's table: its versions in memory (a ``TableView``), its commit files and
    its readers' holds in its folder.

    Compacted to frontier F, a table keeps F's snapshot and every later one, and the changes
    of every version from F on, F's own included (``needed_files`` keeps the files of the
    commits from F to the latest). So the changes of version v, and a chunk or count at v,
    are readable exactly when v >= F."""

    def __init__(self, root: Path, rows: dict[int, str]) -> None:
        super().__init__(rows)
        self.storage = FilesystemStorage(root)
        self.registry = HoldRegistry(self.storage)
        self.location = TableLocation(TableRef("shop", "orders", "customers"), Backend.filesystem(root))
        self.kept_from = 0
        self.storage.write(commit_key(0), b"{}")

    def commit(self, upserts: dict[int, str], deletes: set[int]) -> None:
        super().commit(upserts, deletes)
        self.storage.write(commit_key(self.latest_version()), b"{}")

    def compact(self) -> None:
        """Compactor.compact's round, without OPTIMIZE and broken holds (no maximum hold age)."""
        latest = self.latest_version()
        recorded = self.registry.frontier()
        kept = frontier(self.registry.holds(), latest, margin_version=latest,
                        recorded=0 if recorded is None else recorded.version)
        assert kept >= self.kept_from, f"a hold went below version {self.kept_from}, which compaction took already"
        self.registry.set_frontier(Kept(kept, latest, at_ms=0))
        for version in range(self.kept_from, kept):
            self.storage.delete(commit_key(version))
        self.kept_from = kept

    def readable(self, version: int, what: str) -> None:
        if version < self.kept_from:
            raise Compacted(f"the planner read {what} version {version}, but compaction kept versions from "
                            f"{self.kept_from} on")


@dataclass(frozen=True)
class StoredPlan:
    rows: list[Row]
    frontier: str
    """Its Frontier as JSON, as a plan file's metadata holds it."""
    version: int


def head(plans: int) -> QueryHead:
    return QueryHead(batch=plans, batch_time_ms=0, commit_time_ms=0, offsets={PID: {"plans": plans}})


class Reader:
    """A pipeline reading the table with backfill=True: its driver's holds and planner,
    its query's batches, and the state they leave behind a kill."""

    def __init__(self, table: PublishedTable) -> None:
        self.table = table
        self.stored: dict[int, StoredPlan] = {}
        """The plan store, which survives kills."""
        self.committed = 0
        self.output: list[list[Row]] = []
        """The rows of the committed plans: an exactly-once sink keeps nothing else."""
        self.reads_again = 0
        """Chunks read ahead that could not be handed over: their version compacted meanwhile."""
        self.start()

    def start(self) -> None:
        """A driver's start: the holds first, from the last commit (a first start: the latest
        version), then the planner, from the newest stored plan."""
        self.readers = Readers({PID: TableInput(PID, BACKFILL, self.table.location)}, "shop/tiers", "state-1",
                               "reset it", {PID: self._plan_version}, clock=lambda: 1.0)
        self.readers.open({QUERY: head(self.committed)} if self.committed else {})
        newest = max(self.stored, default=None)
        self.planner = Frontier() if newest is None else Frontier.from_json(self.stored[newest].frontier)
        self.reading: tuple[int, Any, int] | None = None
        """A chunk being read in the planner's own thread: its version, position and limit."""
        self.ahead: ReadAhead[list[Row]] | None = None
        """That chunk, once read, until it is handed over."""
        self.in_line = False
        """After a chunk read ahead was set aside, the next is read within its plan."""

    def _plan_version(self, number: int) -> int | None:
        plan = self.stored.get(number)
        return None if plan is None else plan.version

    def plan(self, budget: int) -> bool:
        """One turn of Planner._run's loop, with at most ``budget`` rows for a chunk: while
        a chunk is read ahead, a plan of changes only; once it is read, it is handed over;
        otherwise a chunk read ahead begins (the first plan, and plans while paused or
        finished, are written at once)."""
        for old in [n for n in self.stored if n < min(self.committed, self.planner.plans)]:
            del self.stored[old]
        if self.planner.plans - self.committed >= LOOKAHEAD:
            return False
        if self.reading is not None:
            return self._store(next_plan(self.planner, self.table, 0, now_ms=1))
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead.fits(self.planner):
            try:
                return self._store(next_plan(self.planner, self.table, ahead.limit, now_ms=1, ahead=ahead))
            except Compacted:  # its keys' changes since its version: read the next chunk in line
                self.reads_again += 1
                self.in_line = True
        if budget and self.planner.version is not None and not self.planner.finished and not self.in_line:
            self.reading = (self.planner.version, self.planner.position, budget)
            return True
        plan = next_plan(self.planner, self.table, budget, now_ms=1)
        self.in_line = self.in_line and not (plan is not None and plan.chunk)
        return self._store(plan)

    def chunk_read(self) -> bool:
        """The planner's other thread reading the chunk; its version may have been compacted
        since the read began. False when no chunk was being read."""
        if self.reading is None:
            return False
        version, position, limit = self.reading
        self.reading = None
        try:
            self.ahead = ReadAhead(version, position, limit, self.table.chunk(version, position, limit))
        except Compacted:
            self.reads_again += 1
            self.in_line = True
        return True

    def _store(self, plan: Plan[list[Row]] | None) -> bool:
        if plan is None:
            return False
        assert plan.frontier.version is not None
        self.stored[plan.frontier.plans] = StoredPlan(plan.rows, plan.frontier.to_json(), plan.frontier.version)
        self.planner = plan.frontier
        return True

    def read(self, plans: int, killed_before_the_hold_moves: bool = False) -> bool:
        """One batch of up to ``plans`` stored plans: written, committed, then the hold moved
        (the batch handler does it after the commit, so a kill may come in between)."""
        last = min(max(self.stored, default=0), self.committed + plans)
        if last <= self.committed:
            return False
        self.output.extend(self.stored[n].rows for n in range(self.committed + 1, last + 1))
        self.committed = last
        if killed_before_the_hold_moves:
            self.start()
        else:
            self.readers.committed(QUERY, head(self.committed), [PID])
        return True

    def hold(self) -> Hold:
        hold = self.table.registry.hold(READER)
        assert hold is not None
        return hold

    def needs(self) -> int | None:
        """The oldest version a restart needs: open() refuses to start below the version its
        last committed plan reached (before any commit, its first plan's). Its planner reads
        only changes after its newest plan's version, at least as new. None before the first
        plan: a restart holds the latest version, and plans from there."""
        if not self.stored:
            return None
        number = max(self.committed, 1)
        assert number in self.stored, f"plan {number} is committed or next, yet gone from the plan store"
        return self.stored[number].version


def check_hold(reader: Reader, previous: Hold | None) -> Hold:
    hold = reader.hold()
    if previous is not None:  # only its reader writes a hold, and only forward
        assert hold.version >= previous.version, f"the hold went back from {previous.version} to {hold.version}"
    needs = reader.needs()
    if needs is not None:
        assert hold.version <= needs, f"the hold is at {hold.version}, but a restart needs {needs}"
        # Its age is measured from the first version it has not consumed: not past what its plans reached.
        assert hold.next <= needs + 1, f"the hold says version {hold.next - 1} is consumed; its plans reached {needs}"
    return hold


keys = st.integers(min_value=0, max_value=30)
step = st.one_of(
    st.tuples(st.just("publish"), st.tuples(st.dictionaries(keys, st.sampled_from("abcd"), max_size=4),
                                            st.sets(keys, max_size=3))),
    st.tuples(st.just("compact"), st.none()),
    st.tuples(st.just("plan"), st.sampled_from([0, 1, 2, 3, 7, 100])),
    st.tuples(st.just("read"), st.sampled_from([1, 2])),
    st.tuples(st.just("read, killed before the hold moves"), st.sampled_from([1, 2])),
    st.tuples(st.just("kill"), st.none()),
    st.tuples(st.just("chunk read"), st.none()),
)


# At least 10 steps: Hypothesis favours short lists, and a kill that matters comes after a
# plan, a commit and a compaction.
@settings(max_examples=EXAMPLES, deadline=None)
@given(initial=st.dictionaries(keys, st.sampled_from("xyz"), max_size=20),
       schedule=st.lists(step, min_size=10, max_size=50))
def test_a_backfilling_reader_killed_anywhere_never_needs_what_compaction_took_and_ends_with_the_table(
        initial: dict[int, str], schedule: list[tuple[str, Any]]) -> None:
    # Nothing may raise: Compacted (a plan read history the holds did not protect; a chunk
    # read ahead may find its version compacted, and is read again) or
    # HoldBroken (a restart needed a version below the frontier).
    with tempfile.TemporaryDirectory(dir=MEMORY) as root:
        table = PublishedTable(Path(root), initial)
        reader = Reader(table)  # a first start: it holds the latest version before any plan
        hold = check_hold(reader, None)
        for kind, arg in schedule:
            if kind == "publish":
                table.commit(*arg)
            elif kind == "compact":
                table.compact()
            elif kind == "plan":
                reader.plan(arg)
            elif kind == "kill":
                reader.start()
            elif kind == "chunk read":
                reader.chunk_read()
            else:
                reader.read(arg, killed_before_the_hold_moves=kind != "read")
            hold = check_hold(reader, hold)
        # No more upstream changes: the planner and the reader run unthrottled to the end.
        while True:
            planned = reader.plan(100)
            read_ahead = reader.chunk_read()
            if not reader.read(LOOKAHEAD) and not planned and not read_ahead:
                break
            hold = check_hold(reader, hold)
            table.compact()
        assert reader.planner.finished
        assert fold(reader.output) == {(k, v): 1 for k, v in table.versions[-1].items()}
        # Caught up, it holds the latest version only: compaction frees everything older.
        assert hold.version == table.latest_version()


def test_the_model_table_refuses_what_compaction_took() -> None:
    """The property's teeth: a planner that carries on from a plan at a compacted version fails."""
    with tempfile.TemporaryDirectory(dir=MEMORY) as root:
        table = PublishedTable(Path(root), {1: "a", 2: "b"})
        early = next_plan(Frontier(), table, 1, now_ms=1)
        assert early is not None and early.frontier.version == 0
        table.commit({1: "A"}, set())
        table.commit({3: "c"}, {2})
        table.compact()  # no hold: the frontier is the latest version
        assert table.registry.frontier() == Kept(2, 2, 0)
        with pytest.raises(Compacted, match="the changes of version 1, but compaction kept versions from 2 on"):
            next_plan(early.frontier, table, 1, now_ms=1)
        assert next_plan(Frontier(), table, 5, now_ms=1) is not None  # the latest version is kept
