"""Run, stop, add input, run again: the pipeline resumes from its last commit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.spark_app.harness import (
    REPO,
    Workspace,
    fold,
    multiset,
    open_backend_workspace,
    read_changelog,
    write_csv,
)
from tests.integration.spark_app.words import expected_counts, expected_even, rows

pytestmark = pytest.mark.spark


def inspect(workspace: Workspace) -> dict[str, object]:
    command = [sys.executable, "-m", "spark_app", "inspect", workspace.state, "--json"]
    if workspace.endpoint_url:
        command += ["--endpoint-url", workspace.endpoint_url]
    return json.loads(subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True).stdout)


def test_restart_reads_only_new_files_and_sets_malformed_rows_aside(workspace: Workspace) -> None:
    for f in range(3):
        write_csv(workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
    first = workspace.driver("--stop-when-idle").start()
    assert first.wait() == 0, first.output()[-3000:]
    assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(3))

    write_csv(workspace.inputs, "part-3.csv", "word,n", rows(3))
    write_csv(workspace.inputs, "part-4.csv", "word,n", [*rows(4), "bad,not-a-number"])
    second = workspace.driver("--stop-when-idle").start()
    assert second.wait() == 0, second.output()[-3000:]

    assert "resuming" in second.output()
    assert "words: 5 files" in second.output() and "words: 3 files" not in second.output()
    assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(5))
    assert multiset(read_changelog(workspace.out / "even.jsonlines")) == expected_even(range(5))

    dead_letters = list((workspace.out / "counts.jsonlines.dead-letter" / "words").glob("*.jsonl"))
    assert [p.name for p in dead_letters] == ["part-4.csv.jsonl"]
    letter = json.loads(dead_letters[0].read_text())
    assert (letter["line"], letter["raw"]) == (8, "bad,not-a-number")
    assert letter["error"] == "column 'n': cannot read 'not-a-number' as INT"

    report = inspect(workspace)
    counts = report["queries"]["counts_jsonlines"]  # type: ignore[index]
    assert counts["offsets"]["words"]["files"] == 5
    assert counts["sources"]["words"]["malformed"] == 1
    assert report["lease"]["released"] is True  # type: ignore[index]


def test_on_s3_spark_writes_its_checkpoint_files_in_place(request: pytest.FixtureRequest, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """On S3 a rename is a copy and a delete, and not atomic, so Spark's checkpoint there (its
    offset and commit logs, the state stores' files) is written in place, by an upload that
    is aborted if its writer fails. Spark takes that setting only when its session starts,
    and a pipeline that names its state in run(), after its sources are declared, had it
    dropped: each file went up under a temporary name and was then copied and deleted. The
    bucket keeps every version, so a temporary object written and deleted is still seen."""
    from spark_app.storage import S3Location

    workspace = open_backend_workspace(request, tmp_path, "s3")
    location = S3Location.parse(workspace.state, endpoint_url=workspace.endpoint_url)
    client = request.getfixturevalue("s3_server").client()
    client.put_bucket_versioning(Bucket=location.bucket, VersioningConfiguration={"Status": "Enabled"})
    for f in range(2):
        write_csv(workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
    driver = workspace.driver("--stop-when-idle").start()
    assert driver.wait() == 0, driver.output()[-3000:]

    prefix = f"{location.prefix}/checkpoints/"
    written = {item["Key"][len(prefix):]
               for page in client.get_paginator("list_object_versions").paginate(Bucket=location.bucket, Prefix=prefix)
               for item in page.get("Versions", []) + page.get("DeleteMarkers", [])}
    assert "counts_jsonlines/offsets/0" in written and "counts_jsonlines/commits/0" in written, sorted(written)
    assert any(key.startswith("counts_jsonlines/state/0/") for key in written), sorted(written)
    temporary = sorted(key for key in written if key.rsplit("/", 1)[-1].startswith(".") and key.endswith(".tmp"))
    assert not temporary, temporary


def test_a_clean_stop_on_s3_leaves_every_state_partition_a_snapshot_of_its_newest_version(
        request: pytest.FixtureRequest, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Spark's state store snapshots reach S3 (the local server, moto's), so a restart loads
    them instead of replaying every changelog file: uploads of local files once failed
    there, silently (Spark ignores a failed maintenance), and a clean stop stores the last."""
    from spark_app.storage import S3Location

    workspace = open_backend_workspace(request, tmp_path, "s3")
    for f in range(2):
        write_csv(workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
    driver = workspace.driver("--stop-when-idle", "--snapshot-interval-ms", "3600000").start()
    assert driver.wait() == 0, driver.output()[-3000:]
    assert "Ignoring error while performing maintenance" not in driver.output()

    location = S3Location.parse(workspace.state, endpoint_url=workspace.endpoint_url)
    client = request.getfixturevalue("s3_server").client()
    prefix = f"{location.prefix}/checkpoints/counts_jsonlines/state/0/"
    files: dict[str, dict[str, list[int]]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            partition, _, name = item["Key"][len(prefix):].partition("/")
            version, _, kind = name.partition(".")
            if version.isdigit() and kind in ("changelog", "zip"):
                files.setdefault(partition, {"changelog": [], "zip": []})[kind].append(int(version))
    assert len(files) == 4, files
    for partition, versions in files.items():
        assert max(versions["zip"], default=0) == max(versions["changelog"]), (partition, versions)


def test_a_driver_killed_while_spark_writes_a_query_s_first_offset_entry_leaves_no_lasting_harm(
        fs_workspace: Workspace) -> None:
    """On a volume Spark writes an offset-log entry to a hidden temporary file and renames
    it. A driver killed (or frozen) between the two leaves the file and no entry, and
    Spark refuses to start a query with no entry in a folder that is not empty
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY): every later driver failed. Seen in the
    Kafka sink's stale-driver test, whose frozen driver held such a file."""
    workspace = fs_workspace
    for f in range(2):
        write_csv(workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
    offsets = workspace.root / "state" / "checkpoints" / "even_jsonlines" / "offsets"
    offsets.mkdir(parents=True)
    leftover = offsets / ".0.6f1d2c1e-0d4b-4c59-9a51-5b1e6c2f0a11.tmp"
    leftover.write_text('v1\n{"batchWatermarkMs":0,"batchTimest')  # cut off mid-write
    driver = workspace.driver("--stop-when-idle").start()
    assert driver.wait() == 0, driver.output()[-3000:]

    assert "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" not in driver.output()
    assert "removed what a driver left unfinished in Spark's checkpoint of even_jsonlines" in driver.output()
    assert not leftover.exists()
    assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(2))
    assert multiset(read_changelog(workspace.out / "even.jsonlines")) == expected_even(range(2))


def test_the_scratch_folders_a_killed_driver_leaves_are_removed_by_the_next_one(
        fs_workspace: Workspace, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Spark's local folder (shuffle blocks, the state stores' working copies), the JVM's
    temporary folder (the native libraries its jars copy out, LZ4's, Snappy's and, when it was
    not unpacked once beside the class archive, RocksDB's 15 MB), the outputs' state and the
    pipeline's context are scratch folders: a driver killed with -9 leaves them (1.6 GB of
    Spark's in 25 minutes of chaos tests), the next driver on the disk removes them, and a
    clean stop removes its own."""
    workspace, scratch_dir = fs_workspace, tmp_path / "tmp"
    scratch_dir.mkdir()
    env = {"TMPDIR": str(scratch_dir)}
    for f in range(2):
        write_csv(workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
    killed = workspace.driver(env=env).start()
    killed.wait_for_log("query counts_jsonlines: committed batch")
    killed.kill()
    left = sorted(p.name for p in scratch_dir.iterdir() if p.name.startswith("spark_app-"))
    kinds = {name.removeprefix("spark_app-scratch-").split("-")[0] for name in left if "-scratch-" in name}
    assert kinds >= {"spark", "jvm", "output", "context"}, left
    jvm = next(scratch_dir.glob("spark_app-scratch-jvm-*"))
    assert list(jvm.glob("liblz4-java*")), sorted(p.name for p in jvm.iterdir())

    resumed = workspace.driver("--stop-when-idle", env=env).start()
    assert resumed.wait() == 0, resumed.output()[-3000:]

    assert f"removed {len(left)} scratch folders of drivers that were killed" in resumed.output()
    assert not [p.name for p in scratch_dir.iterdir() if p.name.startswith("spark_app-")]
    assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(2))
