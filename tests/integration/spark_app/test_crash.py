"""kill -9 at random moments while input keeps arriving; the output must come out exactly
as from a run that never crashed: no changelog row duplicated, none missing.

Each round kills and restarts the driver at least MIN_KILLS (3) times, more while input is
still arriving. `make test` runs one round on the filesystem (the commit-window tests
below and test_chaos.py cover the deterministic points); `make test-chaos` runs
CHAOS_ROUNDS (25) of them on each backend.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from tests.integration.spark_app.harness import (
    Workspace,
    fold,
    multiset,
    open_backend_workspace,
    passes,
    read_changelog,
    wait_until,
    wait_until_passes,
    write_csv,
)
from tests.integration.spark_app.words import expected_counts, expected_even, rows

pytestmark = pytest.mark.spark

ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "1"))
RANDOM_CASES = ([(seed, backend) for seed in range(ROUNDS) for backend in ("filesystem", "s3")]
                if "CHAOS_ROUNDS" in os.environ else [(0, "filesystem")])
FILES = int(os.environ.get("CHAOS_FILES", "16"))
MIN_KILLS = 3


def feed(workspace: Workspace, seed: int, done: threading.Event) -> None:
    pace = random.Random(seed)
    for f in range(FILES):
        write_csv(workspace.inputs, f"part-{f:03d}.csv", "word,n", rows(f))
        time.sleep(pace.uniform(0.1, 0.8))
    done.set()


@pytest.fixture
def random_workspace(request: pytest.FixtureRequest, tmp_path) -> Workspace:  # type: ignore[no-untyped-def]
    return open_backend_workspace(request, tmp_path, request.node.callspec.params["case"][1])


@pytest.mark.parametrize("case", RANDOM_CASES, ids=[f"{b}-{s}" for s, b in RANDOM_CASES])
def test_kill_9_at_random_moments_loses_and_repeats_nothing(random_workspace: Workspace,
                                                             case: tuple[int, str]) -> None:
    workspace, seed = random_workspace, case[0]
    chaos = random.Random(1000 + seed)
    done = threading.Event()
    feeder = threading.Thread(target=feed, args=(workspace, seed, done), daemon=True)
    kills = 0
    epochs = iter(range(1, 1000))

    def next_driver(*extra: str):  # type: ignore[no-untyped-def]
        # Each relaunch carries a higher epoch, as the operator's do.
        return workspace.driver(*extra, env={"SPARK_APP_EPOCH": str(next(epochs))}).start()

    driver = next_driver()
    driver.wait_for_log("pipeline running")
    feeder.start()
    while not done.is_set() or kills < MIN_KILLS:
        # Kill at a random point after the pipeline came up: during start-up, mid-batch,
        # between a batch's output and its commit, or while idle.
        time.sleep(chaos.uniform(0.5, 6.0))
        driver.kill()
        kills += 1
        driver = next_driver()
        if chaos.random() < 0.3:
            time.sleep(chaos.uniform(0, 3))  # sometimes kill it again before it is even up
            continue
        driver.wait_for_log("pipeline running")

    def exact() -> None:
        counts = read_changelog(workspace.out / "counts.jsonlines")
        assert fold(counts, ("word",)) == expected_counts(range(FILES))
        assert multiset(read_changelog(workspace.out / "even.jsonlines")) == expected_even(range(FILES))

    # The last driver reads what is left, then stops on SIGTERM (it commits and exits 0):
    # no further driver is started to catch up.
    wait_until_passes("the last driver caught up", exact, timeout=300, drivers=(driver,))
    driver.terminate()
    assert driver.wait(120) == 0, driver.output()[-3000:]
    exact()
    assert kills >= MIN_KILLS


@pytest.mark.parametrize("point", ["after-output", "after-commit"])
def test_a_crash_in_the_commit_window_is_replayed_exactly(fs_workspace: Workspace, point: str) -> None:
    """Killed after the batch is staged (not committed: the stage is dropped and the batch
    run again), or after spark_app's commit but before the batch is copied into the output
    and Spark records it (the next driver copies it in; Spark's replay writes nothing, yet
    the stateful operators must still commit their state for the batch)."""
    for f in range(2):
        write_csv(fs_workspace.inputs, f"part-{f:03d}.csv", "word,n", rows(f))
    crashed = fs_workspace.driver(env={"SPARK_APP_FAULT": f"{point}:0", "SPARK_APP_EPOCH": "1"}).start()
    assert crashed.wait() == -9
    staged = list((fs_workspace.out / ".counts.jsonlines.pending").glob("e000001-*.jsonl"))
    assert staged, "the crash left no staged batch"
    assert (fs_workspace.out / "counts.jsonlines").stat().st_size == 0  # nothing published before the copy
    for f in range(2, 4):
        write_csv(fs_workspace.inputs, f"part-{f:03d}.csv", "word,n", rows(f))
    resumed = fs_workspace.driver("--stop-when-idle", env={"SPARK_APP_EPOCH": "2"}).start()
    assert resumed.wait() == 0, resumed.output()[-3000:]
    if point == "after-commit":
        assert "copying in bytes 0 to" in resumed.output()
        assert "already committed; replaying it without output" in resumed.output()
    assert not any(p.name.startswith("e000001-") for p in staged[0].parent.iterdir())
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(4))
    assert multiset(read_changelog(fs_workspace.out / "even.jsonlines")) == expected_even(range(4))


def test_a_crash_in_the_middle_of_iterating_gives_the_uninterrupted_result(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Killed after an iteration of the second batch's fixed point: the stored F of the first
    batch is intact, and the replay produces the same components as a run without a crash.

    The second batch is small beside the first, so its changes were appended to the
    stored inputs' log before the crash (in a log segment of the crashed driver's, which
    the next one deletes); the replay must not count them twice. A third
    batch, given to the same driver, shows it: had the edge 12-100 been counted twice,
    deleting it once would leave 100 and 101 in the big component.

    The graph is a path 1-...-6 and a hub 6 with the leaves 7 to 41: 40 edges (enough for
    the second batch's three to be appended) that converge in a few iterations, where a
    path of 40 took 41 cold and 36 more to relabel."""
    edges = tmp_path / "edges"
    graph = [f"{i},{i + 1},1" for i in range(1, 6)] + [f"6,{leaf},1" for leaf in range(7, 42)]
    write_csv(edges, "a.csv", "u,v,diff", graph)
    args = ["examples/connected_components.py", "--edges", str(edges), "--output", str(tmp_path / "cc.jsonlines"),
            "--state", str(tmp_path / "state")]
    from tests.integration.spark_app.harness import Driver

    def labels() -> dict[int, int]:
        return {r["vertex"]: r["label"] for r in fold(read_changelog(tmp_path / "cc.jsonlines"), ("vertex",)).values()}

    def labels_are(expected: dict[int, int]) -> bool:
        def check() -> None:
            assert labels() == expected
        return passes(check)  # False while a batch's lines are still being written

    replayed = {**{v: 1 for v in range(1, 6)}, **{v: 6 for v in [*range(6, 42), 100, 101]}}
    final = {**{v: 1 for v in range(1, 6)}, **{v: 6 for v in range(6, 42)}, 100: 100, 101: 100}
    drivers = [Driver(args + extra, tmp_path / f"driver-{i}.log", {"SPARK_APP_EPOCH": str(i + 1)})
               for i, extra in enumerate([["--stop-when-idle"], ["--stop-when-idle"], []])]
    try:
        assert drivers[0].start().wait() == 0, drivers[0].output()[-3000:]
        write_csv(edges, "b.csv", "u,v,diff", ["100,101,1", "12,100,1", "5,6,-1"])
        crashed = drivers[1]
        crashed.env["SPARK_APP_FAULT"] = "in-iteration:1"
        assert crashed.start().wait() == -9
        # The replay and the third batch in one driver (a driver started for each cost a
        # third of this test): it stops on SIGTERM once the third batch is out.
        resumed = drivers[2].start()
        wait_until("the replayed batch", lambda: labels_are(replayed), timeout=300)
        assert "stored tables that no commit names" in resumed.output()  # the crashed run's
        write_csv(edges, "c.csv", "u,v,diff", ["12,100,-1"])
        wait_until("the third batch", lambda: labels_are(final), timeout=300)
        resumed.terminate()
        assert resumed.wait(120) == 0, resumed.output()[-3000:]
    finally:
        for driver in drivers:
            if driver.process is not None:
                driver.kill()
    assert labels() == final
