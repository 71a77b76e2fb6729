"""A second driver on the same state fails fast; a higher epoch fences the lower one."""

from __future__ import annotations

import pytest

from spark_app import contract
from tests.integration.spark_app.conftest import Workspace
from tests.integration.spark_app.harness import fold, read_changelog, write_csv
from tests.integration.spark_app.test_resume import expected_counts, rows

pytestmark = pytest.mark.spark


def test_a_second_local_driver_fails_fast_with_the_holder_named(fs_workspace: Workspace) -> None:
    write_csv(fs_workspace.inputs, "part-0.csv", "word,n", rows(0))
    first = fs_workspace.driver().start()
    first.wait_for_log("committed batch")
    second = fs_workspace.driver().start()
    assert second.wait() == contract.EXIT_ALREADY_RUNNING
    assert "another driver holds the state" in second.termination_message()
    assert f"pid {first.process.pid}" in second.termination_message()  # type: ignore[union-attr]
    first.terminate()
    assert first.wait() == 0


def test_a_higher_epoch_takes_over_and_the_lower_one_stops_without_committing(fs_workspace: Workspace) -> None:
    write_csv(fs_workspace.inputs, "part-0.csv", "word,n", rows(0))
    old = fs_workspace.driver(env={"SPARK_APP_EPOCH": "1"}).start()
    old.wait_for_log("committed batch")
    new = fs_workspace.driver(env={"SPARK_APP_EPOCH": "2"}).start()
    new.wait_for_log("pipeline running at epoch 2")
    write_csv(fs_workspace.inputs, "part-1.csv", "word,n", rows(1))
    assert old.wait(120) == contract.EXIT_FENCED
    assert "superseded" in old.termination_message()
    new.wait_for_log("words: 2 files")
    new.terminate()
    assert new.wait() == 0
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(2))

    stale = fs_workspace.driver(env={"SPARK_APP_EPOCH": "2"}).start()
    assert stale.wait() == contract.EXIT_FENCED
    assert stale.termination_message().startswith(f"{contract.STALE_EPOCH_PREFIX}2")
