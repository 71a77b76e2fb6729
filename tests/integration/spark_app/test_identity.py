"""Code changes against stored state: incompatible ones are refused with the reasons,
compatible ones keep the state."""

from __future__ import annotations

import shutil

import pytest

from spark_app import contract
from tests.integration.spark_app.harness import Workspace, fold, multiset, read_changelog, write_csv
from tests.integration.spark_app.words import expected_counts, expected_even, rows

pytestmark = pytest.mark.spark


def test_a_changed_key_is_refused_and_a_moved_input_keeps_the_state(fs_workspace: Workspace) -> None:
    for f in range(2):
        write_csv(fs_workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
    assert fs_workspace.driver("--stop-when-idle").start().wait() == 0

    changed = fs_workspace.driver("--stop-when-idle", "--group-by", "n").start()
    assert changed.wait() == contract.EXIT_MISCONFIGURED
    message = changed.termination_message()
    assert "no longer matches its stored state" in message
    assert "output 'counts_jsonlines' has different stateful operators" in message
    assert "python -m spark_app reset" in message

    # The same files under a new folder: same persistent_id, same relative names.
    moved = fs_workspace.root / "moved-inputs"
    shutil.move(str(fs_workspace.inputs), moved)
    write_csv(moved, "part-2.csv", "word,n", rows(2))
    relocated = fs_workspace.driver("--stop-when-idle")
    relocated.args[relocated.args.index("--input") + 1] = str(moved)
    relocated.start()
    assert relocated.wait() == 0, relocated.output()[-3000:]
    assert "now reads" in relocated.output()
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(3))
    assert multiset(read_changelog(fs_workspace.out / "even.jsonlines")) == expected_even(range(3))
