"""A second driver on the same state fails fast; a higher epoch fences the lower one."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from spark_app import contract
from tests.integration.spark_app.harness import Workspace, fold, read_changelog, write_csv
from tests.integration.spark_app.words import expected_counts, rows, wait_for_files

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
    wait_for_files(new, 2)
    new.terminate()
    assert new.wait() == 0
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(2))

    stale = fs_workspace.driver(env={"SPARK_APP_EPOCH": "2"}).start()
    assert stale.wait() == contract.EXIT_FENCED
    assert stale.termination_message().startswith(f"{contract.STALE_EPOCH_PREFIX}2")


def test_the_lease_is_renewed_while_the_driver_starts(fs_workspace: Workspace) -> None:
    """A start can outlast the lease (a JVM on a busy node, a large first batch): if the
    lease is renewed only once the pipeline runs, a driver still starting looks dead to
    the next one, which takes over the state."""
    write_csv(fs_workspace.inputs, "part-0.csv", "word,n", rows(0))
    # Renewed every 1/3 s: the start (queries planned, the first batch run and committed)
    # spans several renewals even on a fast machine, where the default 5 s did not.
    driver = fs_workspace.driver("--lease-ttl-s", "2").start()
    lease = Path(fs_workspace.state) / "lease.json"
    renewals: set[int] = set()
    while "committed batch" not in driver.output():
        assert driver.process is not None and driver.process.poll() is None, driver.output()[-3000:]
        try:
            renewals.add(int(json.loads(lease.read_text())["renewed_ms"]))
        except (OSError, ValueError, KeyError):
            pass  # not written yet, or being replaced
        time.sleep(0.1)
    starting_s = (max(renewals) - min(renewals)) / 1000 if renewals else 0.0
    driver.terminate()
    assert driver.wait() == 0
    assert len(renewals) >= 2, f"the lease was written once and not renewed while the driver started ({renewals})"
    assert starting_s > 0


def test_a_local_driver_killed_with_sigkill_is_replaced_at_once(fs_workspace: Workspace) -> None:
    """Its lease looks live for 30 s, but its holder's process is gone: no wait."""
    write_csv(fs_workspace.inputs, "part-0.csv", "word,n", rows(0))
    first = fs_workspace.driver().start()
    first.wait_for_log("committed batch")
    first.kill()
    again = fs_workspace.driver("--stop-when-idle").start()
    assert again.wait() == 0, again.output()[-3000:]
    assert "taking over at once from epoch 1" in again.output()
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(1))


def test_a_kill_after_a_new_snapshot_is_stored_resumes_from_the_previous_one(fs_workspace: Workspace) -> None:
    """The previous snapshot may go only once the new one is committed: a kill in between
    must not leave the head naming a deleted snapshot (a replay of the whole changelog)."""
    for f in range(2):
        write_csv(fs_workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
    every_batch = ("--snapshot-interval-ms", "1")
    first = fs_workspace.driver(*every_batch, "--stop-when-idle").start()
    assert first.wait() == 0, first.output()[-3000:]
    for f in range(2, 4):
        write_csv(fs_workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
    killed = fs_workspace.driver(*every_batch, env={"SPARK_APP_FAULT": "after-snapshot-write:1"}).start()
    assert killed.wait() == -9, killed.output()[-3000:]
    resumed = fs_workspace.driver(*every_batch, "--stop-when-idle").start()
    assert resumed.wait() == 0, resumed.output()[-3000:]
    assert "is missing; replaying the whole changelog" not in resumed.output()
    restored = [line for line in resumed.output().splitlines() if "output counts_jsonlines: state of" in line]
    assert restored and "(snapshot at byte 0," not in restored[0], restored
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(4))
