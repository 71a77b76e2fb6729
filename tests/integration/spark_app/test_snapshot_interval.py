"""What snapshot_interval_ms means: the stored snapshot of state falls at most about one
interval (plus the batch in flight) behind the last commit; every version after it is in
the changelog. With a long interval the snapshot lags as far as the whole run."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from spark_app.persistence import Backend
from spark_app.state.log import MetadataLog
from tests.integration.spark_app.harness import Workspace, fold, read_changelog, write_csv
from tests.integration.spark_app.words import expected_counts, rows

pytestmark = pytest.mark.spark
QUERY = "counts_jsonlines"
_VERSION = re.compile(r"^(\d+)\.(changelog|zip)$")


def run_until_commits(workspace: Workspace, interval_ms: int, commits: int) -> None:
    stop = threading.Event()

    def feed() -> None:
        for f in range(200):
            if stop.is_set():
                return
            write_csv(workspace.inputs, f"part-{f:03d}.csv", "word,n", rows(f))
            time.sleep(0.3)

    feeder = threading.Thread(target=feed, daemon=True)
    driver = workspace.driver("--snapshot-interval-ms", str(interval_ms)).start()
    driver.wait_for_log("pipeline running")
    feeder.start()
    deadline = time.monotonic() + 300
    while (driver.output().count(f"query {QUERY}: committed batch") < commits and time.monotonic() < deadline
           and driver.process is not None and driver.process.poll() is None):
        time.sleep(0.2)
    committed = driver.output().count(f"query {QUERY}: committed batch")
    driver.kill()  # no graceful stop: a clean stop would store a final snapshot
    stop.set()
    feeder.join()
    assert committed >= commits, driver.output()[-3000:]


def commit_times(state: Path) -> dict[int, int]:
    log = MetadataLog(Backend.filesystem(state).storage())
    times = {}
    for seq in log.sequence_numbers():
        record = log.entry(seq).record  # type: ignore[union-attr]
        if record["kind"] == "commit" and record["detail"]["query"] == QUERY:
            times[record["detail"]["batch"]] = record["time_ms"]
    return times


def state_versions(state: Path) -> tuple[int, int]:
    """(newest version in every partition's changelog, newest snapshot in every partition)."""
    newest_changelog, newest_snapshot = [], []
    for partition in sorted((state / "checkpoints" / QUERY / "state" / "0").glob("[0-9]*")):
        versions: dict[str, list[int]] = {"changelog": [], "zip": []}
        for file in partition.iterdir():
            if match := _VERSION.match(file.name):
                versions[match.group(2)].append(int(match.group(1)))
        newest = max(versions["changelog"], default=0)  # 0: a partition whose first version is being written
        assert sorted(versions["changelog"]) == list(range(1, newest + 1)), "the changelog has a gap"
        newest_changelog.append(newest)
        newest_snapshot.append(max(versions["zip"], default=0))
    return min(newest_changelog), min(newest_snapshot)


def newest_head(state: Path) -> dict[str, Any]:
    entry = json.loads((state / "log" / sorted(p.name for p in (state / "log").iterdir())[-1]).read_text())
    return entry["heads"][QUERY]


def snapshot_lag_ms(workspace: Workspace) -> tuple[int, int, int]:
    """(state snapshot lag, output snapshot lag, longest batch) in ms of commit time."""
    state = Path(workspace.state)
    times = commit_times(state)
    last_batch = max(times)
    newest_version, snapshot_version = state_versions(state)
    assert newest_version >= last_batch + 1
    state_lag = times[last_batch] - times[snapshot_version - 1] if snapshot_version else times[last_batch]
    output_snapshot = newest_head(state)["outputs"][QUERY]["snapshot"]
    output_lag = times[last_batch] - times[output_snapshot["batch"]] if output_snapshot else times[last_batch]
    batches = sorted(times)
    longest = max(times[b] - times[a] for a, b in zip(batches, batches[1:], strict=False))
    return state_lag, output_lag, longest


@pytest.mark.long  # make test: the idle query's test below; the kill rounds replay changelogs
def test_the_snapshot_stays_within_one_interval_and_the_changelog_covers_the_rest(tmp_path: Path) -> None:
    (tmp_path / "short").mkdir()
    (tmp_path / "long").mkdir()
    short = Workspace(tmp_path / "short", str(tmp_path / "short" / "state"))
    run_until_commits(short, interval_ms=1000, commits=8)
    state_lag, output_lag, longest_batch = snapshot_lag_ms(short)
    bound = 1000 + 2 * longest_batch + 2000  # the interval, the batch in flight, a maintenance tick
    assert state_lag <= bound, (state_lag, longest_batch)
    assert output_lag <= bound, (output_lag, longest_batch)

    long = Workspace(tmp_path / "long", str(tmp_path / "long" / "state"))
    run_until_commits(long, interval_ms=3_600_000, commits=8)
    state_lag_long, output_lag_long, _ = snapshot_lag_ms(long)
    assert state_versions(Path(long.state))[1] <= 1  # at most the snapshot of the first version
    assert state_lag_long > bound and output_lag_long > bound

    # Either way the restart is exact: the changelog replays what the snapshot lacks. The
    # killed driver's lease is still live, so the restart carries a higher epoch, as the
    # operator's relaunches do. A clean stop stores a snapshot of its last batch, of the
    # output's state and of Spark's, however long the interval: the next start (an
    # upgrade, a changed spec) replays nothing.
    for workspace, interval_ms in ((short, 1000), (long, 3_600_000)):
        final = workspace.driver("--stop-when-idle", "--snapshot-interval-ms", str(interval_ms),
                                 env={"SPARK_APP_EPOCH": "2"}).start()
        assert final.wait() == 0, final.output()[-3000:]
        files = len(list(workspace.inputs.glob("part-*.csv")))
        assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(files))
        head = newest_head(Path(workspace.state))
        assert head["outputs"][QUERY]["snapshot"]["batch"] == head["batch"], head
        # Spark's state store too: every partition's newest version has its snapshot.
        newest_version, snapshot_version = state_versions(Path(workspace.state))
        assert snapshot_version == newest_version, (snapshot_version, newest_version)


def test_a_query_gone_idle_has_its_last_state_snapshotted_so_a_kill_replays_nothing(tmp_path: Path) -> None:
    """A burst of input, then quiet: within an interval or two the stored snapshot of Spark's
    state stores is of their last version, not only of the last tenth version, so a driver
    killed then (a node lost in a quiet hour) resumes without replaying the burst."""
    workspace = Workspace(tmp_path, str(tmp_path / "state"))
    for f in range(3):
        write_csv(workspace.inputs, f"part-{f:03d}.csv", "word,n", rows(f))
    driver = workspace.driver("--snapshot-interval-ms", "1000").start()
    driver.wait_for_log("pipeline running")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        newest, snapshot = state_versions(Path(workspace.state)) if (
            Path(workspace.state) / "checkpoints" / QUERY / "state" / "0").is_dir() else (0, 0)
        if newest and snapshot == newest and newest_head(Path(workspace.state))["batch"] + 1 == newest:
            break
        time.sleep(0.5)
    driver.kill()
    newest, snapshot = state_versions(Path(workspace.state))
    assert snapshot == newest, f"the snapshot is of version {snapshot}, the last version {newest}"
