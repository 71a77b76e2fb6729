"""Chaos for shared tables, on both storage backends: the publisher and its two readers
(examples/shared_{publisher,tiers,clicks}.py) run side by side while orders and clicks
arrive, and each in turn, at random, is killed with SIGKILL (Python and its JVM, as a
lost node) and started again. Once the input stops and each has read everything, the
changelog reader's table and tiers and the lookup reader's enriched clicks equal a plain
computation over all input: a version skipped or applied twice, or a batch of the
publisher made into two versions, fails.

``make test`` runs one round, on S3 (each of the three killed once, in a random order; the
filesystem backend's shared tables are the other tests of test_shared_tables.py); ``make
test-chaos`` runs CHAOS_ROUNDS rounds on each backend, eight kills each, victims at random.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.spark_app.harness import wait_until_passes
from tests.integration.spark_app.shared import SharedWorkspace, open_workspace
from tests.integration.spark_app.test_shared_tables import txn_batches

pytestmark = pytest.mark.spark

CHAOS = "CHAOS_ROUNDS" in os.environ
ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "1"))
CASES = [(r, ("filesystem", "s3")[r % 2]) for r in range(ROUNDS * 2)] if CHAOS else [(1, "s3")]
KILLS = 8  # in each chaos round; make test's round kills each driver once
ORDER_FILES = 14 if CHAOS else 8
CLICK_FILES = 8 if CHAOS else 5


@pytest.fixture
def chaos_shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SharedWorkspace]:
    workspace = open_workspace(request, tmp_path, request.node.callspec.params["case"][1])
    yield workspace
    workspace.kill_all()


def feed(shared: SharedWorkspace, pace: float) -> threading.Thread:
    def run_feed() -> None:
        for f in range(1, max(ORDER_FILES, CLICK_FILES)):
            if f < ORDER_FILES:
                shared.add_orders(f)
            if f < CLICK_FILES:
                shared.add_clicks(f)
            time.sleep(pace)

    thread = threading.Thread(target=run_feed, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("case", CASES, ids=[f"{b}-{r}" for r, b in CASES])
def test_a_publisher_and_its_readers_killed_at_random_lose_and_repeat_nothing(
        chaos_shared: SharedWorkspace, case: tuple[int, str]) -> None:
    shared = chaos_shared
    chance = random.Random(case[0])
    shared.add_orders(0)
    shared.add_clicks(0)
    # Small compactions, so that a kill can land in one and readers' holds matter.
    publisher_args = ("--max-files-per-trigger", "1", "--compact-every-batches", "2", "--compact-every-s", "3",
                      "--compaction-margin-s", "0")
    starts = {
        "publisher": lambda: shared.publisher(*publisher_args),
        "tiers": lambda: shared.tiers("--max-files-per-trigger", "1"),
        "clicks": lambda: shared.clicks(),
    }
    drivers = {"publisher": starts["publisher"]().start()}
    drivers["publisher"].wait_for_log("orders: 1 files", timeout=240)  # the readers need the table to exist
    drivers.update({name: starts[name]().start() for name in ("tiers", "clicks")})
    feeder = feed(shared, pace=1.5)
    # make test's round kills each once (four victims drawn at random had spared the changelog
    # reader); the chaos rounds draw every victim.
    victims = [chance.choice(sorted(drivers)) for _ in range(KILLS)] if CHAOS else chance.sample(sorted(drivers), len(drivers))
    killed = []
    for victim in victims:
        time.sleep(chance.uniform(4, 14))
        drivers[victim].kill()
        killed.append(victim)
        drivers[victim] = starts[victim]().start()
    feeder.join()
    # The drivers of the last starts read everything there is, then stop on SIGTERM (each
    # commits what it has and exits 0). Starting three more drivers to catch up, as this
    # test did, cost a third of its CPU.
    running = tuple(drivers.values())
    wait_until_passes("the changelog reader caught up", lambda: shared.check_tiers(range(ORDER_FILES)),
                      timeout=300, drivers=running)
    wait_until_passes("the lookup reader caught up", lambda: shared.check_clicks(range(CLICK_FILES)),
                      timeout=300, drivers=running)
    for name, driver in drivers.items():
        driver.terminate()
        assert driver.wait(120) == 0, f"{name}: {driver.output()[-3000:]}"
    assert all(n == 1 for n in txn_batches(shared).values()), f"a batch made two versions (killed {killed})"
    shared.check_tiers(range(ORDER_FILES))
    shared.check_clicks(range(CLICK_FILES))

