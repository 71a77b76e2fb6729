"""A shared table read with the keyed backfill (issue 22 meets issue 21), without Spark: the
key the publisher records, the options a reader may combine, the state's identity, and the
reader's hold, computed from the plans it committed, at every moment it may die."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_app.persistence import Backend
from spark_app.runtime.pipeline import PipelineError, table_backfill_settings
from spark_app.runtime.sources.backfill import Frontier as BackfillFrontier
from spark_app.runtime.sources.delta_table import BackfillSettings, PlanStore
from spark_app.runtime.tables.location import TableLocation
from spark_app.runtime.tables.readers import PlanMissing, Readers, TableInput, backfill_needed
from spark_app.state.delta_log import commit_key
from spark_app.state.identity import Manifest, SourceIdentity, compare
from spark_app.state.records import QueryHead
from spark_app.state.tables import (
    BACKFILL,
    CHANGELOG,
    KEY_PROPERTY,
    LOOKUP,
    Broken,
    Frontier,
    Hold,
    HoldBroken,
    HoldRegistry,
    ReaderId,
    TableError,
    TableRef,
    decode_key,
    encode_key,
)
from spark_app.storage import FilesystemStorage


def test_the_key_goes_into_the_tables_properties_and_back() -> None:
    assert decode_key(encode_key(["region", "customer_id"]), "t") == ("region", "customer_id")
    with pytest.raises(TableError, match=rf"table shop/orders/customers records no key \({KEY_PROPERTY}\).*"
                                         "restart its publisher"):
        decode_key(None, "shop/orders/customers")
    for damaged in ("customer_id", "[]", '[""]', "[1]", "{"):
        with pytest.raises(TableError, match="not a list of column names"):
            decode_key(damaged, "t")


def test_backfill_options_mirror_delta_read_and_refuse_what_the_other_mode_means() -> None:
    assert table_backfill_settings(False, None, None, None, 3, True) is None
    assert table_backfill_settings(True, None, None, None, None, False) == BackfillSettings()
    assert table_backfill_settings(True, 50, 0, 2, None, False) == BackfillSettings(
        chunk_rows=50, rows_per_second=0, max_plans_per_trigger=2)
    with pytest.raises(PipelineError, match="chunk_rows, rows_per_second apply to a backfill: pass backfill=True"):
        table_backfill_settings(False, 50, 10, None, None, False)
    with pytest.raises(PipelineError, match="max_files_per_trigger sizes Delta's own snapshot"):
        table_backfill_settings(True, None, None, None, 4, False)
    with pytest.raises(PipelineError, match="with_version is not offered with backfill=True"):
        table_backfill_settings(True, None, None, None, None, True)
    with pytest.raises(PipelineError, match="chunk_rows must be at least 1"):
        table_backfill_settings(True, 0, None, None, None, False)
    with pytest.raises(PipelineError, match="rows_per_second must be 0"):
        table_backfill_settings(True, None, -1, None, None, False)


@pytest.mark.parametrize(("old", "new", "compatible"), [
    ("table", "table/backfill", False), ("table/backfill", "table", False), ("table", "table", None)])
def test_a_readers_state_knows_one_way_of_reading_a_table(old: str, new: str, compatible: bool | None) -> None:
    def manifest(fmt: str) -> Manifest:
        return Manifest(sources={"s": SourceIdentity("s", fmt, "struct<k:string>", "/t")})

    changes = compare(manifest(old), manifest(new), committed=set())
    assert [c.compatible for c in changes] == ([] if compatible is None else [compatible])


# ---- the hold --------------------------------------------------------------------------------

PLANS = {1: 5, 2: 5, 3: 7, 4: 9}
"""Plan number -> the table version it reached (plans 1 and 2 read chunks at one version)."""


def test_a_plans_version_is_read_from_the_plan_once_and_known_without_a_read_once_written(tmp_path: Path) -> None:
    import pyarrow as pa

    storage = FilesystemStorage(tmp_path)
    writer = PlanStore(storage, "customers")
    assert writer.create(pa.table({"k": [1]}), BackfillFrontier(plans=1, version=5))
    assert writer.create(pa.table({"k": [2]}), BackfillFrontier(plans=2, version=7))
    assert PlanStore(storage, "customers").version(2) == 7  # a restarted driver reads it
    assert PlanStore(storage, "customers").version(3) is None
    storage.delete(writer.key(2))
    assert writer.version(2) == 7  # the commit path asks at every batch: no read for a plan it wrote
    writer.drop_before(2)
    assert writer.version(1) is None and writer.version(2) == 7


def test_the_hold_is_the_version_the_last_committed_plan_reached() -> None:
    assert backfill_needed(3, PLANS.get) == 7
    assert backfill_needed(0, PLANS.get) == 5  # plans written, none committed: the first one's
    assert backfill_needed(0, {}.get) is None  # a first start: no plan yet
    with pytest.raises(PlanMissing, match="plan 6 is committed but not stored"):
        backfill_needed(6, PLANS.get)


class Table:
    """A table's folder with a log of ``latest`` versions (names only: the holds read no more)."""

    def __init__(self, root: Path, latest: int) -> None:
        self.storage = FilesystemStorage(root)
        self.grow(latest)
        self.registry = HoldRegistry(self.storage)
        self.input = TableInput("customers", BACKFILL,
                                TableLocation(TableRef("shop", "orders", "customers"), Backend.filesystem(str(root))))

    def grow(self, latest: int) -> None:
        for version in range(latest + 1):
            self.storage.write(commit_key(version), b"{}")

    def readers(self, plans: dict[int, int]) -> Readers:
        return Readers({"customers": self.input}, "shop/tiers", "state-1", "reset it",
                       {"customers": plans.get}, clock=lambda: 1.0)

    def hold(self) -> tuple[int, int, str]:
        hold = self.registry.hold(ReaderId("shop", "tiers", "customers"))
        assert hold is not None
        return hold.version, hold.next, hold.kind


def head(plans: int) -> QueryHead:
    return QueryHead(batch=plans, batch_time_ms=0, commit_time_ms=0, offsets={"customers": {"plans": plans}})


def test_a_backfilling_reader_holds_what_its_committed_plans_need_at_every_step(tmp_path: Path) -> None:
    table = Table(tmp_path, latest=4)
    plans: dict[int, int] = {}
    readers = table.readers(plans)
    readers.open({})  # a first start: the latest version, before the first plan reads one as new
    assert table.hold() == (4, 4, BACKFILL)
    plans.update({1: 5, 2: 5})
    table.grow(9)
    readers.committed("tiers", head(1), ["customers"])
    assert table.hold() == (5, 6, BACKFILL)
    plans.update({3: 7, 4: 9})  # written ahead; the hold follows commits, not plans
    readers.committed("tiers", head(2), ["customers"])
    assert table.hold() == (5, 6, BACKFILL)
    readers.committed("tiers", head(3), ["customers"])
    assert table.hold() == (7, 8, BACKFILL)
    # Killed: the restarted reader holds what its last commit needs, below its newest plan's version.
    table.readers(plans).open({"tiers": head(3)})
    assert table.hold() == (7, 8, BACKFILL)


def test_a_reader_killed_before_its_first_commit_keeps_holding_below_its_written_plans(tmp_path: Path) -> None:
    """Its planner carries on from the plans it wrote, after version 5: holding the table's
    latest version (as a first start does) would let compaction take versions 6 to 11,
    whose changes the next plan reads."""
    table = Table(tmp_path, latest=4)
    table.readers({}).open({})
    table.grow(12)
    table.readers({1: 5, 2: 5}).open({})
    assert table.hold() == (5, 6, BACKFILL)


def test_a_backfilling_reader_refuses_to_start_once_what_it_needs_was_compacted(tmp_path: Path) -> None:
    table = Table(tmp_path, latest=9)
    table.registry.set_frontier(Frontier(version=8, latest=9, at_ms=0))
    with pytest.raises(HoldBroken, match="reader shop/tiers/customers needs version 7, but its hold was released"):
        table.readers(PLANS).open({"tiers": head(3)})
    with pytest.raises(HoldBroken, match="needs version 5"):  # no commit yet: its first plan's version
        table.readers(PLANS).open({})
    table.readers(PLANS).open({"tiers": head(4)})  # version 9 is kept
    assert table.hold() == (9, 10, BACKFILL)
    # Broken for its age while it ran: it stops at its next commit, and refuses to start again.
    table.registry.mark_broken(Broken(ReaderId("shop", "tiers", "customers"), "state-1", 9, 0, "too old"))
    with pytest.raises(HoldBroken, match=r"needs version 9, but its hold was broken by the publisher \(too old\)"):
        table.readers(PLANS).committed("tiers", head(4), ["customers"])
    with pytest.raises(HoldBroken, match="broken by the publisher"):
        table.readers(PLANS).open({"tiers": head(4)})


def test_a_changelog_and_a_lookup_move_their_holds_as_they_did_beside_the_backfill(tmp_path: Path) -> None:
    """The other two kinds through the same commit path: a changelog holds the version it
    is in (and stops on a broken hold), a lookup the version it read, one past it unread
    (and a broken hold does not stop it: it never needs history)."""
    table = Table(tmp_path, latest=9)
    reader = ReaderId("shop", "tiers", "customers")
    location = table.input.location
    changelog = Readers({"customers": TableInput("customers", CHANGELOG, location)}, "shop/tiers", "state-1",
                        "reset it", clock=lambda: 1.0)
    changelog.open({})
    offset = {"reservoirId": "t", "reservoirVersion": 6, "index": 2, "isStartingVersion": False}
    changelog.committed("tiers", QueryHead(batch=1, batch_time_ms=0, commit_time_ms=0,
                                           offsets={"customers": offset}), ["customers"])
    assert table.hold() == (6, 6, CHANGELOG)
    table.registry.mark_broken(Broken(reader, "state-1", 6, 0, "too old"))
    with pytest.raises(HoldBroken, match="broken by the publisher"):
        changelog.committed("tiers", QueryHead(batch=2, batch_time_ms=0, commit_time_ms=0,
                                               offsets={"customers": offset}), ["customers"])

    lookup = Readers({"customers": TableInput("customers", LOOKUP, location)}, "shop/tiers", "state-1",
                     "reset it", clock=lambda: 1.0)
    lookup.open({})  # warns of the broken hold and holds afresh
    assert table.hold() == (9, 10, LOOKUP)
    table.registry.mark_broken(Broken(reader, "state-1", 9, 0, "too old"))
    lookup.committed("tiers", QueryHead(batch=1, batch_time_ms=0, commit_time_ms=0,
                                        offsets={"customers": {"table_version": 8}}), ["customers"])
    assert table.hold() == (8, 9, LOOKUP)
    lookup.committed("tiers", QueryHead(batch=2, batch_time_ms=0, commit_time_ms=0,
                                        offsets={"customers": {}}), ["customers"])  # no version read: it stands
    assert table.hold() == (8, 9, LOOKUP)


def test_a_refused_readers_hold_does_not_lower_the_frontier_and_let_it_start(tmp_path: Path) -> None:
    """A reader refused for needing versions compaction took leaves its hold behind (the
    hold is written before the frontier is checked, so that a concurrent round sees one or
    the other). The next round must not record a frontier below the one before: versions 5
    to 7 are gone whatever the holds say, and a frontier of 5 let the reader start, to fail
    later on missing files (found by the property test's helper, with a script)."""
    from spark_app.state.compaction import frontier

    table = Table(tmp_path, latest=9)
    table.registry.set_frontier(Frontier(version=8, latest=9, at_ms=0))
    with pytest.raises(HoldBroken, match="needs version 7"):
        table.readers(PLANS).open({"tiers": head(3)})
    recorded = table.registry.frontier()
    assert recorded is not None
    next_round = frontier(table.registry.holds(), latest=9, margin_version=9, recorded=recorded.version)
    table.registry.set_frontier(Frontier(version=next_round, latest=9, at_ms=0))
    with pytest.raises(HoldBroken, match="needs version 7"):
        table.readers(PLANS).open({"tiers": head(3)})
    # Nor does the refused reader's hold keep compaction at version 8 for good: it is gone.
    assert table.registry.hold(ReaderId("shop", "tiers", "customers")) is None
    assert frontier(table.registry.holds(), latest=9, margin_version=9, recorded=8) == 9


def test_a_changelog_reader_killed_before_its_first_commit_holds_the_version_its_planned_batch_reads(
        tmp_path: Path) -> None:
    """Its first driver planned batch 0 at version 4 (Spark's offset log) and was killed
    before committing it; the next driver replays that very plan, reading version 4's
    contents. Holding the table's latest version instead (as a first start does) let
    compaction delete version 4's files, and the replay failed (FAILED_READ_FILE.FILE_NOT_EXIST,
    seen in make test-chaos on S3)."""
    table = Table(tmp_path, latest=4)
    location = table.input.location
    changelog = Readers({"customers": TableInput("customers", CHANGELOG, location)}, "shop/tiers", "state-1",
                        "reset it", clock=lambda: 1.0)
    changelog.open({})
    assert table.hold() == (4, 4, CHANGELOG)
    table.grow(12)
    planned = {"tiers": {"customers": {"reservoirId": "t", "reservoirVersion": 4, "index": -1,
                                       "isStartingVersion": True}}}
    changelog.open({}, planned)
    assert table.hold() == (4, 4, CHANGELOG)
    changelog.open({}, {})  # nothing planned: a first start
    assert table.hold() == (12, 12, CHANGELOG)


def test_a_changelog_reader_holds_the_start_of_its_last_committed_batch_which_spark_may_replay(
        tmp_path: Path) -> None:
    """A driver killed between its commit of a batch and Spark's own commit of it makes the
    next driver's Spark replay that batch from its start. The hold had moved to the batch's
    end at the commit, compaction deleted the files of the versions before it, and the replay
    failed (FAILED_READ_FILE.FILE_NOT_EXIST reading the rest of version 1's contents, seen in
    make test-chaos on S3, round 9). So a changelog holds where its last committed batch
    started, through the commit and across a restart, until the next batch commits."""
    table = Table(tmp_path, latest=1)
    location = table.input.location
    reader = ReaderId("shop", "tiers", "customers")

    def readers() -> Readers:
        return Readers({"customers": TableInput("customers", CHANGELOG, location)}, "shop/tiers", "state-1",
                       "reset it", clock=lambda: 1.0)

    def at(batch: int, version: int, snapshot: bool = False) -> QueryHead:
        offset = {"reservoirId": "t", "reservoirVersion": version, "index": 3, "isStartingVersion": snapshot}
        return QueryHead(batch=batch, batch_time_ms=0, commit_time_ms=0, offsets={"customers": offset})

    first = readers()
    first.open({})  # a first start: the contents of version 1, then its changes
    assert table.hold() == (1, 1, CHANGELOG)
    table.grow(4)
    first.committed("tiers", at(2, 1, snapshot=True), ["customers"])  # batches 0 to 2: version 1's contents
    first.committed("tiers", at(3, 2), ["customers"])  # batch 3: the rest of them, then version 2's changes
    assert table.hold() == (1, 2, CHANGELOG)  # a replay of batch 3 reads version 1's contents again
    # Killed here, before Spark's commit of batch 3: the next driver replays it.
    resumed = readers()
    resumed.open({"tiers": at(3, 2)})
    assert table.hold() == (1, 2, CHANGELOG)
    resumed.committed("tiers", at(4, 3), ["customers"])  # Spark commits batch 3 before it plans batch 4
    assert table.hold() == (2, 3, CHANGELOG)
    resumed.settled("tiers")  # a clean stop: Spark has committed batch 4 too, nothing replays it
    assert table.hold() == (3, 3, CHANGELOG)
    readers().open({"tiers": at(4, 3)}, settled=["tiers"])
    assert table.hold() == (3, 3, CHANGELOG)
    table.registry.put(Hold(reader, CHANGELOG, 2, 3, "state-1", 1))  # killed before Spark's commit of batch 4
    readers().open({"tiers": at(4, 3)})
    assert table.hold() == (2, 3, CHANGELOG)
    # A hold stored by another state of the reader, or broken, says nothing of this one's replays.
    table.registry.put(Hold(reader, CHANGELOG, 0, 0, "state-0", 1))
    readers().open({"tiers": at(4, 3)})
    assert table.hold() == (3, 3, CHANGELOG)


def test_a_changelog_read_by_two_queries_holds_the_start_until_both_have_committed(tmp_path: Path) -> None:
    """Both queries of a pipeline read the table from a first start at version 1; the first
    one's commits moved the hold on while the second had committed nothing, and a replay
    of the second one's first batch would read version 1's contents."""
    table = Table(tmp_path, latest=1)
    readers = Readers({"customers": TableInput("customers", CHANGELOG, table.input.location)}, "shop/tiers",
                      "state-1", "reset it", clock=lambda: 1.0)
    readers.open({}, {}, {"tiers": ["customers"], "changes": ["customers"], "other": ["orders"]})
    table.grow(5)

    def at(batch: int, version: int) -> QueryHead:
        offset = {"reservoirId": "t", "reservoirVersion": version, "index": -1, "isStartingVersion": False}
        return QueryHead(batch=batch, batch_time_ms=0, commit_time_ms=0, offsets={"customers": offset})

    for batch, version in enumerate((2, 3, 4)):
        readers.committed("tiers", at(batch, version), ["customers"])
    assert table.hold() == (1, 1, CHANGELOG)
    readers.committed("changes", at(0, 4), ["customers"])
    assert table.hold() == (1, 4, CHANGELOG)  # its batch 0 started at version 1: a replay reads it
    readers.committed("changes", at(1, 5), ["customers"])
    assert table.hold() == (3, 4, CHANGELOG)  # tiers' batch 2 started at version 3
