"""Shared tables on real Spark, filesystem and S3: a publisher maintains a keyed table,
one reader consumes its changes (examples/shared_tiers.py), another looks it up
(examples/shared_clicks.py); outputs are compared exactly with a plain computation over
all input. Then the holds: compaction stops at a suspended reader's hold, follows it when
it resumes, passes it once it is released, breaks it once it is too old (the reader then
refuses to start, saying what is gone), and keeps storage bounded while readers keep up.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import pytest

from spark_app import contract
from spark_app.faults import AFTER_OUTPUT, IN_TABLE_COMPACTION
from spark_app.persistence import Backend
from spark_app.state.delta_log import TableLog
from spark_app.state.log import MetadataLog
from spark_app.state.tables import HoldRegistry, ReaderId
from tests.integration.spark_app.harness import spark_conf_env, wait_until
from tests.integration.spark_app.shared import SharedWorkspace, run, table_storage

pytestmark = pytest.mark.spark

# make test-long: 30 batches, three compactions (without them the log would keep 30 versions and
# more, over the bound asserted); make test-shared-storage: 500.
STORAGE_BATCHES = int(os.environ.get("SHARED_STORAGE_BATCHES", "30"))
FAST = ("--compact-every-batches", "1", "--compact-every-s", "2", "--compaction-margin-s", "0")
CHECKPOINT_EVERY_2 = spark_conf_env(**{"spark.databricks.delta.properties.defaults.checkpointInterval": "2"})


def head(workspace: SharedWorkspace, name: str) -> dict[str, object]:
    storage = Backend.from_uri(f"{workspace.state}/{name}", endpoint_url=workspace.endpoint_url).storage()
    latest = MetadataLog(storage).latest()
    assert latest is not None
    return latest.record


def txn_batches(workspace: SharedWorkspace) -> Counter[int]:
    """How many versions of the table carry each batch of the publisher."""
    log = TableLog(table_storage(workspace))
    batches: Counter[int] = Counter()
    for version in log.versions():
        for app, batch in log.commit(version).txns.items():
            if "-table-customers" in app:
                batches[batch] += 1
    return batches


# make test runs the example pair only in test_shared_chaos.py's round (on S3, killed at
# random, outputs compared as exactly); make test-long runs it here on the filesystem, make
# test-chaos (CHAOS_ROUNDS) on both (the shared fixture's backends).
@pytest.mark.long
def test_a_published_table_is_read_as_a_changelog_and_looked_up_exactly(shared: SharedWorkspace) -> None:
    shared.add_orders(0)
    run(shared.publisher("--stop-when-idle"))
    run(shared.tiers("--stop-when-idle"))
    shared.add_clicks(0)
    run(shared.clicks("--stop-when-idle"))
    shared.check_tiers(range(1))
    shared.check_clicks(range(1))

    for f in range(1, 4):  # updates, new customers, and a customer inserted then deleted
        shared.add_orders(f)
    run(shared.publisher("--stop-when-idle", "--max-files-per-trigger", "1"))
    run(shared.tiers("--stop-when-idle"))
    shared.add_clicks(1)
    run(shared.clicks("--stop-when-idle"))
    shared.check_tiers(range(4))
    shared.check_clicks(range(2))

    # One version per committed batch of the publisher, its version in the batch's commit.
    publisher = head(shared, "publisher")["heads"]["customers"]  # type: ignore[index]
    assert txn_batches(shared) == Counter({b: 1 for b in range(publisher["batch"] + 1)})
    assert TableLog(table_storage(shared)).txn_version(
        next(iter(TableLog(table_storage(shared)).commit(publisher["outputs"]["customers"]["position"]).txns)),
        publisher["batch"]) == publisher["outputs"]["customers"]["position"]
    # The lookup's batch recorded the version it read: the newest data version then.
    looked_up = head(shared, "clicks")["heads"]["clicks_jsonlines"]["offsets"]["customers_now"]  # type: ignore[index]
    assert looked_up["table_version"] >= publisher["outputs"]["customers"]["position"]
    # Both readers hold a version (a changelog: the next it needs; a lookup: the one it read).
    holds = {h.kind: h for h in HoldRegistry(table_storage(shared)).holds()}
    assert set(holds) == {"changelog", "lookup"}
    assert holds["lookup"].version == looked_up["table_version"]


def test_a_replayed_batch_of_the_publisher_makes_no_second_version(fs_shared: SharedWorkspace) -> None:
    shared = fs_shared
    for f in range(3):
        shared.add_orders(f)
    killed = shared.publisher("--max-files-per-trigger", "1", env={"SPARK_APP_FAULT": f"{AFTER_OUTPUT}:1"}).start()
    assert killed.wait(300) == -9, killed.output()[-3000:]
    assert txn_batches(shared) == Counter({0: 1, 1: 1})  # batch 1 is in the table, not committed
    run(shared.publisher("--stop-when-idle", "--max-files-per-trigger", "1"))
    assert txn_batches(shared) == Counter({0: 1, 1: 1, 2: 1})
    run(shared.tiers("--stop-when-idle"))
    shared.check_tiers(range(3))


def reader_id(workspace: SharedWorkspace, name: str, persistent_id: str = "customers") -> ReaderId:
    state_id = str(head(workspace, name)["state_id"])
    return ReaderId.for_pipeline("", persistent_id, state_id)


def feed_batches(shared: SharedWorkspace, publisher, files: range) -> None:  # type: ignore[no-untyped-def]
    for f in files:
        shared.add_orders(f)
        publisher.wait_for_log(f"orders: {f + 1} files", timeout=240)


def test_compaction_stops_at_a_suspended_readers_hold_follows_it_and_passes_it_once_released(
        fs_shared: SharedWorkspace) -> None:
    shared = fs_shared
    shared.add_orders(0)
    # Delta checkpoints the table every 2 versions (10 by default), so that a few batches
    # past the hold put a checkpoint between it and the newest version.
    run(shared.publisher("--stop-when-idle", *FAST, env=CHECKPOINT_EVERY_2))
    # The first reader reads the table while no publisher runs: with no hold yet and no
    # margin (FAST), a compaction beside it deleted the log behind the first checkpoint while
    # Delta read it (FAILED_READ_FILE on 00000000000000000001.json, once in make test). A
    # reader's first start is what the margin is for; the default is 60 s.
    run(shared.tiers("--stop-when-idle", name="slow"))  # then suspended: its driver is gone, its hold stays
    slow = reader_id(shared, "slow")
    registry = HoldRegistry(table_storage(shared))
    held = registry.hold(slow)
    assert held is not None
    publisher = shared.publisher(*FAST, "--max-files-per-trigger", "1", env=CHECKPOINT_EVERY_2).start()
    fast = shared.tiers(name="fast").start()
    feed_batches(shared, publisher, range(1, 5))
    # Compaction has run past a checkpoint and several batches, and stops at the suspended reader's hold.
    frontier = wait_until("a compaction after the last batch", lambda: (f := registry.frontier()) is not None
                          and f.latest >= held.version + 4 and f)
    assert frontier.version == held.version
    fast.wait_for_log("fast_jsonlines: committed batch", timeout=60)
    assert registry.hold(slow).version == held.version  # type: ignore[union-attr]

    # Resumed, the suspended reader reads every change it missed: exact.
    run(shared.tiers("--stop-when-idle", name="slow"))
    shared.check_tiers(range(5), name="slow")
    caught_up = registry.hold(slow)
    assert caught_up is not None and caught_up.version > held.version
    feed_batches(shared, publisher, range(5, 7))
    wait_until("the frontier past the old hold", lambda: registry.frontier().version > held.version)  # type: ignore[union-attr]
    storage = table_storage(shared)
    log = TableLog(storage)
    assert log.versions()[0] > 0, "the log below the newest checkpoint under the frontier is gone"

    # Released (its PersistentPipeline deleted), the hold goes at once and stops nothing.
    from spark_app.__main__ import main

    assert main(["tables", "release", "--reader", f"{slow.namespace}/{slow.pipeline}",
                 f"{shared.publisher_state}/tables/customers"]) == 0
    assert registry.hold(slow) is None
    feed_batches(shared, publisher, range(7, 9))
    fast_reader = reader_id(shared, "fast")
    wait_until("the frontier at the fast reader",
               lambda: registry.frontier().version >= min(registry.hold(fast_reader).version,  # type: ignore[union-attr]
                                                          registry.frontier().latest))  # type: ignore[union-attr]
    publisher.terminate()
    assert publisher.wait() == 0, publisher.output()[-3000:]
    fast.terminate()
    assert fast.wait() == 0, fast.output()[-3000:]
    shared.check_tiers(range(9), name="fast")


def test_a_reader_whose_hold_was_broken_refuses_to_start_saying_what_is_gone(fs_shared: SharedWorkspace) -> None:
    shared = fs_shared
    shared.add_orders(0)
    # The reader runs while no publisher does: a publisher running beside it broke its hold
    # before its first commit whenever that took longer than the hold age (20 s once, in a run
    # of 2 workers), and the test is about a suspended reader's hold.
    run(shared.publisher("--stop-when-idle", *FAST))
    run(shared.tiers("--stop-when-idle", name="slow"))
    slow = reader_id(shared, "slow")
    registry = HoldRegistry(table_storage(shared))
    held = registry.hold(slow)
    assert held is not None
    publisher = shared.publisher(*FAST, "--max-files-per-trigger", "1", "--max-hold-age-s", "4").start()
    feed_batches(shared, publisher, range(1, 4))
    broken = wait_until("the stale hold broken", lambda: registry.broken(slow), timeout=120)
    assert broken.version == held.version and "maximum hold age" in broken.reason
    wait_until("the frontier past the broken hold", lambda: registry.frontier().version > held.version)  # type: ignore[union-attr]
    refused = shared.tiers(name="slow").start()
    assert refused.wait(300) == contract.EXIT_TABLE_VERSIONS_GONE, refused.output()[-3000:]
    message = refused.termination_message()
    assert f"needs version {held.version}" in message and "are gone" in message
    assert "maximum hold age" in message and "spark_app reset" in message
    publisher.terminate()
    assert publisher.wait() == 0


def test_a_publisher_killed_in_the_middle_of_a_compaction_leaves_a_readable_table(
        fs_shared: SharedWorkspace) -> None:
    shared = fs_shared
    for f in range(4):  # the first round deletes the files OPTIMIZE merged: the second dies in its deletions
        shared.add_orders(f)
    killed = shared.publisher(*FAST, "--max-files-per-trigger", "1",
                              env={"SPARK_APP_FAULT": f"{IN_TABLE_COMPACTION}:2"}).start()
    assert killed.wait(300) == -9, killed.output()[-3000:]
    run(shared.publisher("--stop-when-idle", *FAST))
    run(shared.tiers("--stop-when-idle"))
    shared.check_tiers(range(4))


@pytest.mark.long  # make test: the suspended reader's test sees compaction delete the old log
def test_storage_of_a_table_stays_bounded_while_its_readers_keep_up(fs_shared: SharedWorkspace) -> None:
    """SHARED_STORAGE_BATCHES batches (30 in make test-long, 500 in make test-shared-storage)
    with a changelog reader following: the table's folder holds the latest snapshot, the
    versions since the frontier and the log from its checkpoint on, however long the
    history grows."""
    shared = fs_shared
    shared.add_orders(0)
    publisher = shared.publisher("--compact-every-batches", "10", "--compaction-margin-s", "5",
                                 "--max-files-per-trigger", "1", "--trigger-interval-ms", "100").start()
    publisher.wait_for_log("orders: 1 files")
    reader = shared.tiers().start()
    sizes = []
    for f in range(1, STORAGE_BATCHES):
        shared.add_orders(f)
        if f % 20 == 0:
            publisher.wait_for_log(f"orders: {f + 1} files", timeout=300)
            storage = table_storage(shared)
            sizes.append((f, storage.size(""), len(storage.list(""))))
    publisher.wait_for_log(f"orders: {STORAGE_BATCHES} files", timeout=600)
    reader.wait_for_log("tiers_jsonlines: committed batch", timeout=120)
    time.sleep(8)  # the margin, then one more compaction
    publisher.terminate()
    assert publisher.wait() == 0, publisher.output()[-3000:]
    reader.terminate()
    assert reader.wait() == 0, reader.output()[-3000:]
    storage = table_storage(shared)
    log = TableLog(storage)
    entries = storage.list_entries("")
    data = sum(e.size for e in entries if not e.path.startswith("_"))
    checkpoint = json.loads(storage.read("_delta_log/_last_checkpoint"))
    print(json.dumps({"batches": STORAGE_BATCHES, "versions": log.latest(), "bytes": storage.size(""),
                      "checkpoint_actions": checkpoint["size"],
                      "data_bytes": data, "files": len(entries), "log_files": len(log.keys()),
                      "sizes": sizes}))
    versions = log.versions()
    assert len(versions) <= 25, f"the log keeps {len(versions)} commits"
    # The newest checkpoint: the snapshot's few files and a minute of removed files' tombstones
    # (before they expired after a minute, 500 batches left 1,916 actions in it).
    assert checkpoint["size"] <= 400, f"the checkpoint holds {checkpoint['size']} actions"
    # Data files: the latest snapshot (one file after OPTIMIZE), the files changed since
    # the frontier (at most the 10 batches between compactions and the margin's), each
    # with its Hadoop checksum.
    assert len([e for e in entries if not e.path.startswith("_") and not e.path.startswith(".")]) <= 40
    shared.check_tiers(range(STORAGE_BATCHES))
