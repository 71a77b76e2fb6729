"""The holds of shared tables as records (spark_app.state.tables): references, reader
identities, the registry beside a table, positions, and how changes become diffs."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_app.state.tables import (
    CHANGE_DIFFS,
    CHANGELOG,
    Broken,
    ChangelogPosition,
    Frontier,
    Hold,
    HoldBroken,
    HoldRegistry,
    LookupPosition,
    ReaderId,
    TableError,
    TableRef,
)
from spark_app.storage import FilesystemStorage


def test_a_table_is_named_in_the_readers_namespace_or_another() -> None:
    assert TableRef.parse("orders-enriched/customers", "shop") == TableRef("shop", "orders-enriched", "customers")
    assert str(TableRef.parse("crm/orders-enriched/customers", "shop")) == "crm/orders-enriched/customers"
    for bad in ("customers", "a/b/c/d", "a//c", "p/bad name"):
        with pytest.raises(TableError):
            TableRef.parse(bad, "shop")


def test_a_reader_is_its_pipeline_and_input() -> None:
    assert ReaderId.for_pipeline("shop/tiers", "customers", "abc").key == "shop__tiers__customers"
    local = ReaderId.for_pipeline("", "customers", "0123456789abcdef")
    assert (local.namespace, local.pipeline) == ("local", "state-0123456789ab")
    assert str(ReaderId.for_pipeline("tiers", "in", "x")) == "local/tiers/in"


def test_changes_map_to_diffs() -> None:
    assert CHANGE_DIFFS == {"insert": 1, "update_postimage": 1, "update_preimage": -1, "delete": -1}


def test_a_changelog_position_is_deltas_offset_typed() -> None:
    offset = {"sourceVersion": 1, "reservoirId": "t-1", "reservoirVersion": 7, "index": 3,
              "isStartingVersion": True}
    position = ChangelogPosition.from_offset(offset)
    assert position == ChangelogPosition("t-1", 7, 3, True) and position.needed == 7
    with pytest.raises(TableError, match="not a Delta streaming offset"):
        ChangelogPosition.from_offset({"files": 3})
    assert LookupPosition.from_offset(LookupPosition(4).to_offset()) == LookupPosition(4)
    assert LookupPosition.from_offset({"files": 3}) is None


def test_the_registry_keeps_one_hold_per_reader(tmp_path: Path) -> None:
    registry = HoldRegistry(FilesystemStorage(tmp_path))
    a, b = ReaderId("ns", "a", "in"), ReaderId("ns", "b", "in")
    registry.put(Hold(a, CHANGELOG, 3, 3, "s1", 10))
    registry.put(Hold(b, CHANGELOG, 5, 5, "s2", 10))
    registry.put(Hold(a, CHANGELOG, 4, 4, "s1", 20))
    assert sorted((h.reader.pipeline, h.version) for h in registry.holds()) == [("a", 4), ("b", 5)]
    assert registry.release(a) and not registry.release(a)
    assert [h.reader for h in registry.holds()] == [b]


def test_a_break_is_recorded_once_and_outlives_the_readers_updates(tmp_path: Path) -> None:
    registry = HoldRegistry(FilesystemStorage(tmp_path))
    reader = ReaderId("ns", "a", "in")
    registry.put(Hold(reader, CHANGELOG, 3, 3, "s1", 10))
    assert registry.mark_broken(Broken(reader, "s1", 3, 100, "too old"))
    assert not registry.mark_broken(Broken(reader, "s1", 4, 200, "again"))
    registry.put(Hold(reader, CHANGELOG, 9, 9, "s1", 300))  # a late update does not undo it
    assert registry.broken(reader) == Broken(reader, "s1", 3, 100, "too old")
    assert [h.version for h in registry.holds()] == [9]  # markers are not holds
    registry.clear_broken(reader)
    assert registry.broken(reader) is None


def test_the_frontier_is_stored_beside_the_holds(tmp_path: Path) -> None:
    registry = HoldRegistry(FilesystemStorage(tmp_path))
    assert registry.frontier() is None
    registry.set_frontier(Frontier(12, 20, 5))
    assert registry.frontier() == Frontier(12, 20, 5)


def test_a_damaged_hold_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = FilesystemStorage(tmp_path)
    storage.write("_holds/ns__a__in.json", b"{trunc")
    assert HoldRegistry(storage).holds() == []
    assert "not a hold record" in caplog.text


def test_the_refusal_says_which_versions_are_gone_and_how_to_rebuild() -> None:
    reader = ReaderId("shop", "tiers", "customers")
    error = HoldBroken("shop/orders/customers", reader, 12, 40, Broken(reader, "s", 12, 0, "held 12 for 2h"),
                       "change spec.persistence.resetNonce")
    text = str(error)
    assert "needs version 12" in text and "versions before 40 are gone" in text
    assert "held 12 for 2h" in text and "resetNonce" in text
    released = str(HoldBroken("shop/orders/customers", reader, 12, None, None, "reset it"))
    assert "released" in released
