"""`spark_app tables release`, as a deleted reader's cleanup pod runs it: the tables come
from SPARK_APP_TABLE_INPUTS (as the operator injects them), and only that reader's holds
go; a table whose publisher is gone has none to release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_app import contract
from spark_app.__main__ import main
from spark_app.state.tables import CHANGELOG, LOOKUP, Hold, HoldRegistry, ReaderId
from spark_app.storage import FilesystemStorage


def test_a_readers_holds_go_and_nobody_elses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    table, gone = tmp_path / "orders" / "tables" / "customers", tmp_path / "deleted" / "tables" / "customers"
    registry = HoldRegistry(FilesystemStorage(str(table)))
    mine = [ReaderId("team", "tiers", "customers"), ReaderId("team", "tiers", "customers_now")]
    other = ReaderId("team", "clicks", "customers")
    for reader, kind in ((mine[0], CHANGELOG), (mine[1], LOOKUP), (other, CHANGELOG)):
        registry.put(Hold(reader, kind, 3, 3, "state-1", 0))
    inputs = (contract.TableInput("team/orders/customers", str(table)),
              contract.TableInput("team/deleted/customers", str(gone)))
    monkeypatch.setenv(contract.TABLE_INPUTS, json.dumps([i.to_json() for i in inputs]))
    assert main(["tables", "release", "--reader", "team/tiers"]) == 0
    assert [h.reader for h in registry.holds()] == [other]
    printed = capsys.readouterr().out
    assert "released the hold of team/tiers/customers" in printed and "team/tiers held nothing on" in printed
    assert main(["tables", "release", "--reader", "tiers"]) == contract.EXIT_MISCONFIGURED


def test_the_tables_may_be_named_after_the_reader_as_the_usage_shows(tmp_path: Path) -> None:
    """`tables release --reader NS/NAME URI...`: the URIs after the option are the tables."""
    table = tmp_path / "orders" / "tables" / "customers"
    registry = HoldRegistry(FilesystemStorage(str(table)))
    registry.put(Hold(ReaderId("team", "tiers", "customers"), CHANGELOG, 3, 3, "state-1", 0))
    assert main(["tables", "release", "--reader", "team/tiers", str(table)]) == 0
    assert registry.holds() == []
    with pytest.raises(SystemExit):
        main(["tables", "release", "--reader", "team/tiers", str(table), "--no-such-option"])
