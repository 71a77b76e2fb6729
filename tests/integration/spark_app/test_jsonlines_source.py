"""The JSON-lines file source keeps the CSV source's guarantees (one file index, bounded
batches, dead letters), and a source's format may change under its persistent id: JSON
lines earlier, CSV now, and a restart carries on from the committed files."""

from __future__ import annotations

import json

import pytest

from tests.integration.spark_app.harness import (
    Workspace,
    fold,
    multiset,
    read_changelog,
    write_csv,
    write_jsonlines,
)
from tests.integration.spark_app.test_resume import inspect
from tests.integration.spark_app.words import expected_counts, expected_even, rows

pytestmark = pytest.mark.spark


def as_json(file_number: int) -> list[str]:
    return [json.dumps({"word": word, "n": int(n)}) for word, n in (r.split(",") for r in rows(file_number))]


def test_json_lines_then_csv_under_the_same_persistent_id_after_a_kill(fs_workspace: Workspace) -> None:
    workspace = fs_workspace
    for f in range(3):
        lines = as_json(f)
        if f == 1:
            lines.insert(2, '{"word": "w9", "n": "not a number"}')  # line 3 of part-1.jsonl
        write_jsonlines(workspace.inputs, f"part-{f}.jsonl", lines)
    # One file a batch, killed right after spark_app committed the batch of the last JSON
    # file and before Spark recorded it: the next driver replays that batch (without output),
    # and its stateful count must see part-2.jsonl as JSON again, as every file is read in
    # the format its source had when the file was admitted. (Before that was recorded, the
    # replay read it as CSV, its first line as the header, and the counts lost the file:
    # seen once in make test, when the test's own kill fell in that window.)
    json_driver = workspace.driver("--format", "jsonlines", "--pattern", "*.jsonl", "--max-files-per-trigger", "1",
                                   env={"SPARK_APP_EPOCH": "1", "SPARK_APP_FAULT": "after-commit:2"}).start()
    assert json_driver.wait() == -9, json_driver.output()[-3000:]

    for f in (3, 4):
        write_csv(workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
    csv_driver = workspace.driver("--format", "csv", "--pattern", "*.csv", "--stop-when-idle",
                                  env={"SPARK_APP_EPOCH": "2"}).start()
    assert csv_driver.wait() == 0, csv_driver.output()[-3000:]

    assert "source 'words' now reads csv (was jsonlines)" in csv_driver.output()
    assert "already committed; replaying it without output" in csv_driver.output()
    assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(5))
    assert multiset(read_changelog(workspace.out / "even.jsonlines")) == expected_even(range(5))
    letter = json.loads((workspace.out / "counts.jsonlines.dead-letter" / "words" / "part-1.jsonl.jsonl").read_text())
    assert (letter["file"], letter["line"], letter["raw"]) == ("part-1.jsonl", 3, '{"word": "w9", "n": "not a number"}')
    report = inspect(workspace)
    counts = report["queries"]["counts_jsonlines"]  # type: ignore[index]
    assert counts["offsets"]["words"]["files"] == 5
    assert counts["sources"]["words"]["malformed"] == 1
