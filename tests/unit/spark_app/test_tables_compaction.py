"""What a shared table's compaction keeps and removes (spark_app.state.compaction), and
the Delta log as spark_app reads it (spark_app.state.delta_log): pure, no Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_app.state import compaction as plan
from spark_app.state.delta_log import Commit, LogDamaged, TableLog, commit_key, log_keys_below, parse_commit
from spark_app.state.tables import CHANGELOG, LOOKUP, Hold, ReaderId
from spark_app.storage import FileEntry, FilesystemStorage

MINUTE = 60_000


def hold(version: int, next_version: int | None = None, who: str = "r", kind: str = CHANGELOG) -> Hold:
    return Hold(ReaderId("ns", who, "in"), kind, version, version if next_version is None else next_version,
                "state", 0)


def times(**by_version: int) -> plan.Timestamps:
    table = {int(k.removeprefix("v")): v for k, v in by_version.items()}
    return table.get


# ---- the frontier ---------------------------------------------------------------------------


def test_the_frontier_is_the_lowest_hold() -> None:
    assert plan.frontier([hold(7), hold(3), hold(9)], latest=12, margin_version=12) == 3


def test_without_holds_only_the_latest_version_and_the_margin_are_kept() -> None:
    assert plan.frontier([], latest=12, margin_version=12) == 12
    assert plan.frontier([], latest=12, margin_version=10) == 10


def test_a_hold_past_the_latest_version_keeps_the_latest() -> None:
    # A changelog reader that consumed everything holds the next version, not yet written.
    assert plan.frontier([hold(13)], latest=12, margin_version=12) == 12


def test_the_margin_keeps_what_was_the_latest_a_margin_ago() -> None:
    committed = times(v0=0, v1=10 * MINUTE, v2=14 * MINUTE, v3=15 * MINUTE)
    # Now is minute 15 with a 2-minute margin: version 1 was the latest at minute 13.
    assert plan.latest_before(3, committed, 13 * MINUTE) == 1
    assert plan.latest_before(3, committed, 16 * MINUTE) == 3
    assert plan.latest_before(3, committed, 0) == 0


@given(st.lists(st.integers(0, 50), max_size=6), st.integers(0, 50), st.integers(0, 50))
def test_the_frontier_never_passes_a_hold_the_margin_or_the_latest(holds: list[int], latest: int,
                                                                   margin: int) -> None:
    found = plan.frontier([hold(v) for v in holds], latest, margin)
    assert found <= max(0, latest) and found <= max(0, margin)
    assert all(found <= v for v in holds)


# ---- hold ages ------------------------------------------------------------------------------


def test_a_current_reader_has_no_age() -> None:
    age = plan.hold_age(hold(6), latest=5, timestamp_ms=times(v5=0), now_ms=10 * MINUTE)
    assert (age.behind, age.age_ms) == (0, 0)


def test_a_reader_behind_is_as_old_as_the_first_version_it_has_not_consumed() -> None:
    committed = times(v3=1 * MINUTE, v4=4 * MINUTE, v5=9 * MINUTE)
    age = plan.hold_age(hold(3), latest=5, timestamp_ms=committed, now_ms=10 * MINUTE)
    assert (age.behind, age.age_ms) == (3, 9 * MINUTE)


def test_an_idle_lookup_is_not_behind_until_the_table_moves() -> None:
    # A lookup that read version 5 holds 5 and has consumed it: behind only once 6 exists.
    committed = times(v5=0, v6=8 * MINUTE)
    assert plan.hold_age(hold(5, 6, kind=LOOKUP), 5, committed, 10 * MINUTE).behind == 0
    assert plan.hold_age(hold(5, 6, kind=LOOKUP), 6, committed, 10 * MINUTE).age_ms == 2 * MINUTE


def test_holds_behind_for_longer_than_the_maximum_age_are_broken() -> None:
    committed = times(v1=0, v2=5 * MINUTE, v3=9 * MINUTE)
    ages = [plan.hold_age(h, 3, committed, 10 * MINUTE) for h in (hold(1, who="old"), hold(3, who="new"),
                                                                  hold(4, who="done"))]
    assert [a.hold.reader.pipeline for a in plan.stale(ages, 5 * MINUTE)] == ["old"]
    assert plan.stale(ages, None) == []


def test_the_lowest_hold_of_a_reader_behind_is_what_blocks_compaction_and_a_current_one_blocks_nothing() -> None:
    """A current changelog reader holds where its last batch started (version 4, all of 5
    read: a replay of that batch reads from 4), which keeps one batch and is not shown as
    blocking; a suspended one at the same version, with versions unread, is."""
    committed = times(v4=0, v5=MINUTE)
    current = plan.hold_age(hold(4, 6, who="current"), 5, committed, 10 * MINUTE)
    suspended = plan.hold_age(hold(4, 5, who="suspended"), 5, committed, 10 * MINUTE)
    assert plan.blocking([current], frontier=4, latest=5) == []
    assert plan.blocking([current, suspended], frontier=4, latest=5) == [suspended]
    assert plan.blocking([suspended], frontier=5, latest=5) == []  # nothing left to compact
    assert plan.blocking([suspended], frontier=5, latest=7) == []  # the margin, not the hold, is at the frontier


def test_a_hold_whose_version_is_gone_counts_as_stale() -> None:
    age = plan.hold_age(hold(1), 3, times(v3=0), 10 * MINUTE)
    assert age.age_ms is None and plan.stale([age], 60 * MINUTE) == [age]


# ---- files ----------------------------------------------------------------------------------


def commit(version: int, adds: set[str] = frozenset(), removes: set[str] = frozenset(),  # type: ignore[assignment]
           cdc: set[str] = frozenset(), data_change: bool = True) -> Commit:  # type: ignore[assignment]
    return Commit(version, 0, "MERGE", frozenset(adds), frozenset(removes), frozenset(cdc), {}, data_change)


def test_needed_files_are_the_frontiers_snapshot_later_additions_and_every_versions_changes() -> None:
    commits = [
        commit(5, adds={"b2"}, removes={"b1"}, cdc={"_change_data/c5"}),   # an update: change data
        commit(6, adds={"big"}, removes={"a", "b2"}, data_change=False),  # OPTIMIZE
        commit(7, adds={"d"}),                                             # an insert: read as inserts
        commit(8, removes={"d"}),                                          # a delete of a whole file
    ]
    needed = plan.needed_files({"a", "b2"}, commits)
    assert needed == {"a", "b2", "_change_data/c5", "big", "d"}
    # b1 (replaced at version 5, which wrote change data) is needed by no version from 5 on.
    assert "b1" not in needed


def test_data_files_nobody_needs_go_with_their_checksums_once_older_than_the_margin() -> None:
    now = 100 * MINUTE
    old, new = now - 10 * MINUTE, now - 1000
    entries = [
        FileEntry("part-1.parquet", 10, old), FileEntry(".part-1.parquet.crc", 1, old),
        FileEntry("part-2.parquet", 10, old),                                   # needed
        FileEntry("part-3.parquet", 10, new),                                   # a write in flight
        FileEntry("_change_data/cdc-1.parquet", 10, old),
        FileEntry("_delta_log/00000000000000000001.json", 10, old),             # the log: not data
        FileEntry("_holds/ns__p__in.json", 10, old), FileEntry("_compaction/frontier.json", 10, old),
        FileEntry(".probe/writable", 0, old),
    ]
    doomed = plan.doomed_data_files(entries, {"part-2.parquet"}, now, 5 * MINUTE)
    assert doomed == [".part-1.parquet.crc", "_change_data/cdc-1.parquet", "part-1.parquet"]


def test_the_log_goes_below_the_newest_checkpoint_at_or_below_the_frontier() -> None:
    keys = [f"_delta_log/{v:020d}.json" for v in range(25)] + [
        "_delta_log/00000000000000000010.checkpoint.parquet", "_delta_log/00000000000000000020.checkpoint.parquet",
        "_delta_log/.00000000000000000003.json.crc", "_delta_log/00000000000000000003.crc",
        "_delta_log/_last_checkpoint", "_delta_log/00000000000000000000.00000000000000000004.compacted.json"]
    doomed = plan.doomed_log_keys(keys, [10, 20], frontier_version=17)
    assert "_delta_log/00000000000000000009.json" in doomed
    assert "_delta_log/00000000000000000010.json" not in doomed
    assert "_delta_log/00000000000000000010.checkpoint.parquet" not in doomed
    assert {"_delta_log/.00000000000000000003.json.crc", "_delta_log/00000000000000000003.crc",
            "_delta_log/00000000000000000000.00000000000000000004.compacted.json"} <= set(doomed)
    assert "_delta_log/_last_checkpoint" not in doomed
    assert plan.doomed_log_keys(keys, [10, 20], frontier_version=9) == []


def test_only_files_of_the_version_under_the_threshold_count_as_mergeable() -> None:
    entries = [FileEntry("big.parquet", 5_000, 0), FileEntry("small.parquet", 10, 0),
               FileEntry("gone.parquet", 10, 0), FileEntry("_change_data/c.parquet", 10, 0)]
    assert plan.mergeable({"big.parquet", "small.parquet"}, entries, below_bytes=100) == 1
    assert plan.mergeable({"big.parquet", "small.parquet"}, entries, below_bytes=10_000) == 2
    # A file of the version that the listing lacks is counted: OPTIMIZE runs and says why.
    assert plan.mergeable({"small.parquet", "unlisted.parquet"}, entries, below_bytes=100) == 2


# ---- the Delta log --------------------------------------------------------------------------


def delta_commit(version: int, *actions: dict[str, object], timestamp: int = 1000) -> bytes:
    info = {"commitInfo": {"timestamp": timestamp, "operation": "MERGE",
                           "operationMetrics": {"numTargetRowsInserted": "2", "numTargetRowsDeleted": "1",
                                                "executionTimeMs": "x"}}}
    return "\n".join(json.dumps(a) for a in (info, *actions)).encode()


def test_a_commit_is_read_with_its_files_transactions_and_metrics() -> None:
    parsed = parse_commit(4, delta_commit(
        4, {"txn": {"appId": "app", "version": 7}}, {"add": {"path": "a%20b.parquet", "dataChange": True}},
        {"remove": {"path": "old.parquet", "dataChange": True}}, {"cdc": {"path": "_change_data/c.parquet"}}))
    assert parsed.adds == {"a b.parquet"} and parsed.removes == {"old.parquet"}
    assert parsed.change_files == {"_change_data/c.parquet"}
    assert parsed.txns == {"app": 7} and parsed.timestamp_ms == 1000
    assert parsed.metrics == {"numTargetRowsInserted": 2, "numTargetRowsDeleted": 1}


def test_a_damaged_commit_is_named() -> None:
    with pytest.raises(LogDamaged, match="00000000000000000003.json"):
        parse_commit(3, b"{not json")


def test_a_batchs_version_is_found_by_its_transaction_id(tmp_path: Path) -> None:
    storage = FilesystemStorage(tmp_path)
    for version, txn in enumerate([None, 0, None, 1, 2]):
        actions = [{"txn": {"appId": "app", "version": txn}}] if txn is not None else []
        storage.write(commit_key(version), delta_commit(version, *actions))
    log = TableLog(storage)
    assert log.versions() == [0, 1, 2, 3, 4] and log.latest() == 4
    assert [log.txn_version("app", b) for b in (0, 1, 2, 3)] == [1, 3, 4, None]
    assert log.txn_version("other", 0) is None


SCHEMA = '{"type":"struct","fields":[]}'


def test_a_versions_files_are_replayed_from_its_commits(tmp_path: Path) -> None:
    storage = FilesystemStorage(tmp_path)
    storage.write(commit_key(0), delta_commit(0, {"metaData": {"schemaString": SCHEMA, "partitionColumns": []}},
                                              {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
                                              {"add": {"path": "a.parquet", "partitionValues": {}}}))
    storage.write(commit_key(1), delta_commit(1, {"add": {"path": "b%20c.parquet", "partitionValues": {}}}))
    storage.write(commit_key(2), delta_commit(2, {"remove": {"path": "a.parquet"}},
                                              {"add": {"path": "d.parquet", "partitionValues": {}}}))
    log = TableLog(storage)
    assert log.files_at(0) == (SCHEMA, {"a.parquet"})
    assert log.files_at(1) == (SCHEMA, {"a.parquet", "b c.parquet"})
    assert log.files_at(2) == (SCHEMA, {"b c.parquet", "d.parquet"})
    assert log.files_at(3) is None  # no such version
    storage.delete(commit_key(0))  # cleaned up behind a checkpoint
    assert TableLog(storage).files_at(2) is None


@pytest.mark.parametrize("action", [
    {"add": {"path": "x.parquet", "partitionValues": {}, "deletionVector": {"storageType": "u"}}},
    {"add": {"path": "x.parquet", "partitionValues": {"day": "1"}}},
    {"metaData": {"schemaString": SCHEMA, "configuration": {"delta.columnMapping.mode": "name"}}},
    {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"]}},
    {"metaData": {"partitionColumns": []}},  # no schema: not read as Parquet, and not an error
])
def test_a_version_that_needs_more_than_parquet_has_no_plain_files(tmp_path: Path, action: dict[str, object]) -> None:
    storage = FilesystemStorage(tmp_path)
    storage.write(commit_key(0), delta_commit(0, {"metaData": {"schemaString": SCHEMA, "partitionColumns": []}},
                                              {"add": {"path": "a.parquet", "partitionValues": {}}}))
    storage.write(commit_key(1), delta_commit(1, action))
    log = TableLog(storage)
    assert log.files_at(0) is not None and log.files_at(1) is None


def test_log_keys_below_keep_unknown_files() -> None:
    assert log_keys_below(["_delta_log/_staged_commits/x.json", "_delta_log/00000000000000000001.json"], 5) == [
        "_delta_log/00000000000000000001.json"]
