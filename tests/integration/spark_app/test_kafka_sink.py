"""The Kafka sink against a real broker: one transaction per batch, read back with
isolation.level=read_committed, each change exactly once across kill -9 before and after
the transaction's commit, and a stale driver fenced by the broker's producer epoch.

The changelogs read back are folded and compared exactly with a plain computation over
all input (a duplicated or missing change fails), as the file outputs' are.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_app import contract
from spark_app.faults import AFTER_KAFKA_COMMIT, FAULT, FAULT_ACTION, IN_KAFKA_TRANSACTION
from tests.integration.spark_app.harness import PIPELINES, REPO, Driver, Workspace, fold, multiset, write_csv
from tests.integration.spark_app.words import expected_counts, expected_even, rows
from tests.support.kafka import KafkaBroker, start_broker, stop_broker

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def to_kafka(workspace: Workspace, broker: KafkaBroker, topic: str, *extra: str, epoch: int,
             env: dict[str, str] | None = None) -> Driver:
    args = [str(PIPELINES / "words_to_kafka.py"), "--input", str(workspace.inputs), "--out-dir", str(workspace.out),
            "--state", workspace.state, "--bootstrap-servers", broker.bootstrap_servers, "--topic", topic, *extra]
    runs = len(list(workspace.root.glob("driver-*.log")))
    driver = Driver(args, workspace.root / f"driver-{runs}.log", {"SPARK_APP_EPOCH": str(epoch), **(env or {})})
    workspace.started.append(driver)
    return driver.start()


def changelog(broker: KafkaBroker, topic: str, read_committed: bool = True) -> list[dict[str, object]]:
    """The topic's changes, each partition in order (a key's changes are all in one)."""
    return [json.loads(m.value or b"null") for m in broker.consume_all(topic, read_committed=read_committed)]


def topics(broker: KafkaBroker) -> str:
    topic = broker.new_topic(partitions=2)
    broker.create_topic(f"{topic}-even", partitions=2)
    return topic


def exact(broker: KafkaBroker, topic: str, files: range) -> None:
    assert fold(changelog(broker, topic), ("word",)) == expected_counts(files)
    assert multiset(changelog(broker, f"{topic}-even")) == expected_even(files)


def feed(workspace: Workspace, files: range) -> None:
    for f in files:
        write_csv(workspace.inputs, f"part-{f:03d}.csv", "word,n", rows(f))


# make test: inside the transaction (the abort path); after the commit replays a committed batch.
@pytest.mark.parametrize("point", [IN_KAFKA_TRANSACTION, pytest.param(AFTER_KAFKA_COMMIT, marks=pytest.mark.long)])
def test_a_driver_killed_around_the_kafka_commit_writes_each_change_once(
        kafka_broker: KafkaBroker, fs_workspace: Workspace, point: str) -> None:
    workspace, topic = fs_workspace, topics(kafka_broker)
    feed(workspace, range(2))
    first = to_kafka(workspace, kafka_broker, topic, "--stop-when-idle", epoch=1)
    assert first.wait() == 0, first.output()[-3000:]
    exact(kafka_broker, topic, range(2))

    feed(workspace, range(2, 6))
    # One file a batch: killed in batch 2 of one of the outputs, inside its transaction or
    # right after Kafka committed it (and before the metadata log did).
    killed = to_kafka(workspace, kafka_broker, topic, "--max-files-per-trigger", "1", epoch=2,
                      env={FAULT: f"{point}:2"})
    assert killed.wait() == -9, f"never reached {point}:2\n" + killed.output()[-3000:]
    resumed = to_kafka(workspace, kafka_broker, topic, "--stop-when-idle", epoch=3)
    assert resumed.wait() == 0, resumed.output()[-3000:]

    exact(kafka_broker, topic, range(6))
    everything = len(changelog(kafka_broker, topic, False)) + len(changelog(kafka_broker, f"{topic}-even", False))
    committed = len(changelog(kafka_broker, topic)) + len(changelog(kafka_broker, f"{topic}-even"))
    if point == IN_KAFKA_TRANSACTION:
        # The killed batch's messages reached the log, in a transaction that was aborted,
        # and the resumed driver produces that batch again. (The other output runs at the
        # same time and may have been killed between its own Kafka commit and its metadata
        # log commit, in its batch 1, which is then rightly found in Kafka: not batch 2, or
        # its transaction would have been where the fault fired.)
        assert everything > committed
        assert "batch 2 is in Kafka already" not in resumed.output()
    else:
        # The output whose fault fired committed batch 2 in Kafka, so its topic holds no
        # aborted message. The other output runs at the same time and may have been killed
        # inside a transaction of its own, whose messages stay in its topic, aborted (a run
        # of 2026-12-02: counts' batch 1 in flight when even's fault fired, 53 messages
        # against 43 committed over both topics).
        found = re.search(r"output (\w+): batch 2 is in Kafka already", resumed.output())
        assert found, resumed.output()[-3000:]
        fired = {"counts": topic, "even": f"{topic}-even"}[found.group(1)]
        assert len(changelog(kafka_broker, fired, False)) == len(changelog(kafka_broker, fired))


def test_a_stale_driver_is_fenced_by_the_producer_epoch(kafka_broker: KafkaBroker, fs_workspace: Workspace) -> None:
    workspace, topic = fs_workspace, topics(kafka_broker)
    feed(workspace, range(2))
    # Frozen (SIGSTOP) inside batch 1's transaction, its messages sent and not committed:
    # a driver stuck in a long pause, or cut off, while a newer one takes over.
    stale = to_kafka(workspace, kafka_broker, topic, "--max-files-per-trigger", "1", epoch=1,
                     env={FAULT: f"{IN_KAFKA_TRANSACTION}:1", FAULT_ACTION: "stop"})
    wait_until_stopped(stale)
    try:
        feed(workspace, range(2, 4))
        newer = to_kafka(workspace, kafka_broker, topic, "--stop-when-idle", epoch=2)
        assert newer.wait() == 0, newer.output()[-3000:]
        exact(kafka_broker, topic, range(4))
    finally:
        stale.thaw()
    # Thawed, it stops fenced: by the broker (a newer producer epoch) at the commit of its
    # transaction, or by the metadata log's lease in its other query, whichever comes first.
    # Either way the broker aborted that transaction when the newer driver started: its
    # messages are in the log and no read_committed consumer sees them.
    assert stale.wait(120) == contract.EXIT_FENCED, stale.output()[-3000:]
    exact(kafka_broker, topic, range(4))
    aborted = sum(len(changelog(kafka_broker, t, read_committed=False)) - len(changelog(kafka_broker, t))
                  for t in (topic, f"{topic}-even"))  # the frozen transaction was one output's
    assert aborted > 0


START_AN_OUTPUT = """
import logging, sys
from spark_app.contract import KafkaConnection
from spark_app.persistence import Backend
from spark_app.runtime.sinks.base import OutputContext
from spark_app.runtime.sinks.kafka import KafkaOutput

logging.basicConfig(level=logging.INFO)
bootstrap, topic, state_id, snapshots = sys.argv[1:]
output = KafkaOutput("counts", topic, None, None, KafkaConnection(bootstrap))
output.recover(None, OutputContext(1, state_id, Backend.from_uri(snapshots).storage()))
output.close()
"""


def test_an_output_starts_on_a_broker_whose_group_coordinator_is_still_loading(tmp_path: Path) -> None:
    """On a broker just started, the first offset fetches of a group are answered
    NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS. The output's start reads its marker
    then; through librdkafka's admin client that killed the driver with SIGSEGV before its
    first batch (librdkafka#5040), seen as the sink tests' clean first run dying with -11.
    Each start runs in a process of its own, so that a crash is an exit code here."""
    (tmp_path / "kafka").mkdir()
    process, broker = start_broker(tmp_path / "kafka")
    try:
        topic = broker.new_topic(partitions=2)
        for state_id in ("first", "second", "third"):  # a new group each, as a new pipeline's
            started = subprocess.run(
                [sys.executable, "-c", START_AN_OUTPUT, broker.bootstrap_servers, topic, state_id,
                 str(tmp_path / state_id)], cwd=REPO, capture_output=True, text=True, timeout=300)
            assert started.returncode == 0, started.stderr[-3000:]
            assert "Kafka holds batches up to -1" in started.stderr, started.stderr[-3000:]
    finally:
        stop_broker(process)


def wait_until_stopped(driver: Driver, timeout: float = 180) -> None:
    assert driver.process is not None
    stat = Path(f"/proc/{driver.process.pid}/stat")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if driver.process.poll() is not None:
            raise AssertionError(f"driver exited ({driver.process.returncode}):\n{driver.output()[-3000:]}")
        if stat.read_text().rpartition(")")[2].split()[0] == "T":
            return
        time.sleep(0.2)
    driver.kill()
    raise AssertionError(f"driver never stopped at its fault point:\n{driver.output()[-3000:]}")


def test_the_sink_s_fault_points_are_spark_app_s() -> None:
    """Not Spark: the points this file kills at are the ones spark_app.faults lists."""
    from spark_app import faults

    assert {IN_KAFKA_TRANSACTION, AFTER_KAFKA_COMMIT} <= set(faults.BATCH_POINTS)
    assert os.environ.get(FAULT) is None
