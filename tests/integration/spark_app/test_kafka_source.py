"""The Kafka source against a real broker (tests/support/kafka.py): offsets commit with each
batch, so outputs stay exact across kill -9; a restart resumes from the committed offsets
(never a consumer group's); batches are bounded; partitions added mid-run are read;
offsets that retention removed stop the driver with the gap named, or are skipped and
counted; messages that do not parse go to the dead letters with topic, partition and offset.

Every output is folded and compared exactly with a plain computation over all messages.
`make test` kills at each fault point in turn, `make test-long` adds one round at random;
`make test-chaos` runs CHAOS_ROUNDS of both.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time

import pytest

from spark_app import contract
from spark_app.faults import (
    AFTER_COMMIT,
    AFTER_OUTPUT,
    AFTER_PUBLISH,
    AFTER_SNAPSHOT_COMMIT,
    AFTER_SNAPSHOT_WRITE,
    IN_RECOVERY,
    IN_STORAGE_WRITE,
)
from tests.integration.spark_app.harness import Driver, Workspace, fold, multiset, read_changelog
from tests.integration.spark_app.test_resume import inspect
from tests.integration.spark_app.words import expected_counts, expected_even, messages, rows
from tests.support.kafka import KafkaBroker, Message

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

CHAOS = "CHAOS_ROUNDS" in os.environ
ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "1"))
FILES = 12
MIN_KILLS = 2


def produce_files(broker: KafkaBroker, topic: str, files: range, partitions: int,
                  extra: dict[int, list[bytes]] | None = None) -> None:
    """The rows of each "file" as messages to partition file % partitions, in one
    transaction each (with ``extra`` messages of that file after its rows)."""
    for f in files:
        values = messages(f) + (extra or {}).get(f, [])
        broker.produce(topic, [Message(None, v, partition=f % partitions) for v in values],
                       transactional_id=f"feeder-{topic}")


def exact(workspace: Workspace, files: range) -> None:
    assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(files)
    assert multiset(read_changelog(workspace.out / "even.jsonlines")) == expected_even(files)


def committed(workspace: Workspace) -> dict[str, object]:
    report = inspect(workspace)
    return report["queries"]["counts_jsonlines"]  # type: ignore[index,no-any-return]


@pytest.mark.long  # make test: kill -9 at each fault point in turn, below
@pytest.mark.parametrize("seed", range(ROUNDS))
def test_kill_9_while_messages_arrive_loses_and_repeats_nothing(
        kafka_broker: KafkaBroker, fs_workspace: Workspace, seed: int) -> None:
    workspace, chaos = fs_workspace, random.Random(seed)
    topic = kafka_broker.new_topic(partitions=3)
    malformed = {5: [b'{"word": "w1", "n": "five"}', b"not json"]}
    done = threading.Event()

    def feed() -> None:
        for f in range(FILES):
            produce_files(kafka_broker, topic, range(f, f + 1), 3, malformed)
            time.sleep(chaos.uniform(0.2, 1.0))
        done.set()

    epochs = iter(range(1, 1000))

    def next_driver(*extra: str):  # type: ignore[no-untyped-def]
        return workspace.kafka_driver(kafka_broker.bootstrap_servers, topic, "--max-offsets-per-trigger", "10",
                                      *extra, env={"SPARK_APP_EPOCH": str(next(epochs))}).start()

    driver = next_driver()
    driver.wait_for_log("pipeline running")
    threading.Thread(target=feed, daemon=True).start()
    kills = 0
    while not done.is_set() or kills < MIN_KILLS:
        driver.wait_for_log("committed batch", timeout=120)
        time.sleep(chaos.uniform(0.0, 3.0))
        driver.kill()
        kills += 1
        driver = next_driver()
        driver.wait_for_log("pipeline running")
    driver.kill()
    final = next_driver("--stop-when-idle")
    assert final.wait() == 0, final.output()[-3000:]

    exact(workspace, range(FILES))
    assert "resuming" in final.output()
    # The two malformed messages of file 5, with where they came from.
    letters = [json.loads(line) for path in (workspace.out / "counts.jsonlines.dead-letter" / "words" / topic).rglob("*.jsonl")
               for line in path.read_text().splitlines()]
    assert sorted((r["offset"], r["raw"], r["topic"], r["partition"]) for r in letters) == [
        (13, '{"word": "w1", "n": "five"}', topic, 2), (14, "not json", topic, 2)]
    # File 5 is partition 2's second transaction: its rows at 7 to 12, then these two.
    assert sorted((r["offset"], r["error"]) for r in letters) == [
        (13, "column 'n': cannot read 'five' as INT"), (14, "not valid JSON: Expecting value at column 1")]
    head = committed(workspace)
    assert head["sources"]["words"]["malformed"] == 2  # type: ignore[index]
    assert head["sources"]["words"]["lost"] == 0  # type: ignore[index]
    assert head["offsets"]["words"] == {topic: {str(p): o for p, o in kafka_broker.end_offsets(topic).items()}}  # type: ignore[index]


# Each driver of the walk is killed at one point, in the batch after the last one it found
# committed (the counted points: the first time it reaches them). make test walks a sample;
# make test-chaos every point.
FAULT_WALK = ([(AFTER_OUTPUT, 1), (AFTER_COMMIT, 2), (AFTER_PUBLISH, 3), (AFTER_SNAPSHOT_WRITE, 4),
               (AFTER_SNAPSHOT_COMMIT, 5), (IN_RECOVERY, 1), (IN_STORAGE_WRITE, 3)] if CHAOS else
              [(AFTER_COMMIT, 1), (AFTER_SNAPSHOT_WRITE, 2), (IN_RECOVERY, 1)])


def test_kill_9_at_each_fault_point_in_turn_loses_and_repeats_nothing(
        kafka_broker: KafkaBroker, fs_workspace: Workspace) -> None:
    workspace = fs_workspace
    topic = kafka_broker.new_topic(partitions=2)
    produce_files(kafka_broker, topic, range(FILES), 2)
    for epoch, (point, n) in enumerate(FAULT_WALK, start=1):
        # Batches of at most 7 offsets, each snapshotted (the snapshot points are reached).
        driver = workspace.kafka_driver(kafka_broker.bootstrap_servers, topic, "--max-offsets-per-trigger", "7",
                                        "--snapshot-interval-ms", "1",
                                        env={"SPARK_APP_EPOCH": str(epoch), "SPARK_APP_FAULT": f"{point}:{n}"}).start()
        assert driver.wait() == -9, f"not killed at {point}:{n}: " + driver.output()[-3000:]
    final = workspace.kafka_driver(kafka_broker.bootstrap_servers, topic, "--stop-when-idle",
                                   env={"SPARK_APP_EPOCH": str(len(FAULT_WALK) + 1)}).start()
    assert final.wait() == 0, final.output()[-3000:]
    exact(workspace, range(FILES))
    assert committed(workspace)["offsets"]["words"] == {  # type: ignore[index]
        topic: {str(p): o for p, o in kafka_broker.end_offsets(topic).items()}}


def test_bounded_batches_a_replayed_batch_and_partitions_added_mid_run(
        kafka_broker: KafkaBroker, fs_workspace: Workspace) -> None:
    workspace = fs_workspace
    topic = kafka_broker.new_topic(partitions=1)
    produce_files(kafka_broker, topic, range(4), 1)  # 24 records, and 4 transaction markers
    # Batches of at most 7 offsets; killed in batch 1 after its rows are staged and before
    # its commit, with Spark's offset log a batch ahead of the metadata log.
    killed = workspace.kafka_driver(kafka_broker.bootstrap_servers, topic, "--max-offsets-per-trigger", "7",
                                    env={"SPARK_APP_EPOCH": "1", "SPARK_APP_FAULT": f"{AFTER_OUTPUT}:1"}).start()
    assert killed.wait() == -9, killed.output()[-3000:]

    driver = workspace.kafka_driver(kafka_broker.bootstrap_servers, topic, "--max-offsets-per-trigger", "7",
                                    env={"SPARK_APP_EPOCH": "2"}).start()
    both_at(driver, topic, {"0": 28})
    kafka_broker.add_partitions(topic, 3)
    # Picked up while still empty: a batch reads no record and records them at offset 0.
    both_at(driver, topic, {"0": 28, "1": 0, "2": 0})
    produce_files(kafka_broker, topic, range(4, 10), 3)  # files 4..9 to partitions 1, 2, 0, ...
    both_at(driver, topic, {str(p): o for p, o in kafka_broker.end_offsets(topic).items()})
    driver.terminate()
    assert driver.wait() == 0, driver.output()[-3000:]

    exact(workspace, range(10))
    # Bounded. Spark splits the 7 offsets over the partitions with records in proportion to
    # what each holds, rounding a share below one up (no partition starves): a batch reads
    # at most 7 offsets plus one per other partition. Each partition only moves forward,
    # from 0 once added, and every batch reads something but the one that picked up the
    # partitions added while they were empty.
    batches = [json.loads(found)[topic] for found in re.findall(
        r"query counts_jsonlines: committed batch \d+ \(words: (\{.*\})\)", killed.output() + driver.output())]
    before: dict[str, int] = {}
    for batch in batches:
        moved = {p: o - before.get(p, 0) for p, o in batch.items()}
        assert set(batch) >= set(before) and min(moved.values()) >= 0, batches
        assert sum(moved.values()) <= 7 + len(batch) - 1, batches
        assert sum(moved.values()) > 0 or set(batch) > set(before), batches
        before = batch
    assert before == {str(p): o for p, o in kafka_broker.end_offsets(topic).items()}
    assert sum(before.values()) == 28 + 42


def both_at(driver: Driver, topic: str, offsets: dict[str, int]) -> None:
    """Until each query has committed ``offsets`` of ``topic`` (its own line: one query may
    lag the other, and a driver stopped then leaves the lagging one short)."""
    logged = re.escape(json.dumps({topic: offsets}, separators=(",", ":"), sort_keys=True))
    for query in ("counts_jsonlines", "even_jsonlines"):
        driver.wait_for_log(rf"query {query}: committed batch \d+ \(words: {logged}\)", timeout=120, pattern=True)


def reported_lag(workspace: Workspace, driver: Driver, topic: str) -> dict[str, int]:
    """The counts query's lag of ``topic`` in the driver's report (kept in its lease), once
    the report has one for each partition."""
    lease = workspace.root / "state" / "lease.json"
    deadline = time.monotonic() + 60
    while True:
        try:
            status = json.loads(lease.read_text()).get("status") or {}
            lag = status["queries"]["counts_jsonlines"]["lag"]["words"][topic]
            if len(lag) == 2:
                return lag  # type: ignore[no-any-return]
        except (OSError, ValueError, KeyError):
            pass  # not written yet, being replaced, or no lag reported yet
        assert time.monotonic() < deadline, f"no lag reported: {lease.read_text()[:2000]}\n{driver.output()[-3000:]}"
        time.sleep(0.5)


def test_offsets_removed_by_retention_stop_the_driver_or_are_skipped_and_counted(
        kafka_broker: KafkaBroker, fs_workspace: Workspace) -> None:
    workspace = fs_workspace
    topic = kafka_broker.new_topic(partitions=2)
    produce_files(kafka_broker, topic, range(2), 2)
    first = workspace.kafka_driver(kafka_broker.bootstrap_servers, topic, "--stop-when-idle").start()
    assert first.wait() == 0, first.output()[-3000:]
    before = kafka_broker.end_offsets(topic)  # 7 each: six records and a transaction marker

    # While the pipeline is down, files 2 and 4 land in partition 0 and retention removes
    # file 2 (and the first record of file 4) before they were read.
    produce_files(kafka_broker, topic, range(2, 6), 2)
    kafka_broker.delete_records(topic, {0: before[0] + 8})
    stopped = workspace.kafka_driver(kafka_broker.bootstrap_servers, topic, "--stop-when-idle").start()
    assert stopped.wait() == contract.EXIT_MISCONFIGURED, stopped.output()[-3000:]
    assert stopped.termination_message().startswith(
        f"source 'words': offsets 7 to 14 of topic '{topic}' partition 0 (8 offsets) are gone from Kafka "
        "before they were read")
    assert "fail_on_data_loss=False" in stopped.termination_message()

    skipping = workspace.kafka_driver(kafka_broker.bootstrap_servers, topic, "--stop-when-idle",
                                      "--skip-data-loss").start()
    assert skipping.wait() == 0, skipping.output()[-3000:]
    lost_rows = rows(2) + rows(4)[:1]
    counts = expected_counts(range(6))
    for row in lost_rows:
        word, n = row.split(",")
        counts[(word,)] = {"word": word, "count": counts[(word,)]["count"] - 1,  # type: ignore[operator]
                           "total": counts[(word,)]["total"] - int(n)}  # type: ignore[operator]
    assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == counts
    assert committed(workspace)["sources"]["words"]["lost"] == 8  # type: ignore[index]


def test_the_first_start_reads_from_latest_and_a_restart_resumes_from_the_committed_offsets(
        kafka_broker: KafkaBroker, fs_workspace: Workspace) -> None:
    workspace = fs_workspace
    topic = kafka_broker.new_topic(partitions=2)
    produce_files(kafka_broker, topic, range(2), 2)  # before the first start: never read
    first = workspace.kafka_driver(kafka_broker.bootstrap_servers, topic, "--starting-offsets", "latest",
                                   env={"SPARK_APP_EPOCH": "1"}).start()
    # The initial offsets are chosen (and stored in Spark's checkpoint) at each query's first trigger.
    deadline = time.monotonic() + 120
    initial = [workspace.root / "state" / "checkpoints" / q / "sources" / "0" / "0" for q in ("counts_jsonlines", "even_jsonlines")]
    while not all(p.exists() for p in initial):
        assert time.monotonic() < deadline and first.process.poll() is None, first.output()[-3000:]  # type: ignore[union-attr]
        time.sleep(0.2)
    produce_files(kafka_broker, topic, range(2, 4), 2)
    ends = kafka_broker.end_offsets(topic)
    first.wait_for_log(json.dumps({topic: {str(p): o for p, o in sorted(ends.items())}}, separators=(",", ":")))
    # Caught up, the driver reports each partition's lag (the operator's LAG column and
    # metric read this report): 0 behind the end offsets it has seen.
    assert reported_lag(workspace, first, topic) == {"0": 0, "1": 0}
    assert "could not build the driver's report" not in first.output()
    first.kill()

    produce_files(kafka_broker, topic, range(4, 6), 2)  # while it is down
    second = workspace.kafka_driver(kafka_broker.bootstrap_servers, topic, "--starting-offsets", "latest",
                                    "--stop-when-idle", env={"SPARK_APP_EPOCH": "2"}).start()
    assert second.wait() == 0, second.output()[-3000:]
    exact(workspace, range(2, 6))


# Values that are not one record of "word STRING, n INT", and the reason in each letter.
# Spark's JSON reader alone would keep the first of two objects, the text of a number for a
# string, and text whose bytes are not UTF-8 with replacement characters.
NOT_RECORDS = [
    (b'{"word": "w1", "n": "five"}', "column 'n': cannot read 'five' as INT"),
    (b"not json", "not valid JSON: Expecting value at column 1"),
    (b"null", "expected a JSON object, found null"),
    (b'[{"word": "w1", "n": 1}]', "expected a JSON object, found list"),
    (b'{"word": "w1", "n": 1} {"word": "w2", "n": 2}', "holds 2 records; a message must hold one"),
    (b'{"word": 5, "n": 1}', "column 'word': cannot read '5' as STRING"),
    (b'{"word": "w\xff", "n": 1}', "is not valid UTF-8 (byte 0xff at column 12)"),
    (b" ", "the message's value is empty"),
    (None, "the message has no value (a tombstone)"),
]


def test_each_message_that_is_not_one_record_of_the_schema_is_set_aside_with_its_reason(
        kafka_broker: KafkaBroker, fs_workspace: Workspace) -> None:
    workspace = fs_workspace
    topic = kafka_broker.new_topic(partitions=1)
    produce_files(kafka_broker, topic, range(2), 1)  # offsets 0 to 13, two transaction markers among them
    kafka_broker.produce(topic, [Message(None, value, partition=0) for value, _ in NOT_RECORDS],
                         transactional_id=f"feeder-{topic}")
    produce_files(kafka_broker, topic, range(2, 3), 1)
    driver = workspace.kafka_driver(kafka_broker.bootstrap_servers, topic, "--stop-when-idle").start()
    assert driver.wait() == 0, driver.output()[-3000:]

    exact(workspace, range(3))
    letters = [json.loads(line) for path in (workspace.out / "counts.jsonlines.dead-letter" / "words" / topic).rglob("*.jsonl")
               for line in path.read_text().splitlines()]
    assert sorted((r["offset"], r["raw"], r["error"]) for r in letters) == [
        (14 + i, None if value is None else value.decode("utf-8", "replace"), error)
        for i, (value, error) in enumerate(NOT_RECORDS)]
    assert committed(workspace)["sources"]["words"]["malformed"] == len(NOT_RECORDS)  # type: ignore[index]


def test_a_missing_topic_stops_the_driver_naming_it(kafka_broker: KafkaBroker, fs_workspace: Workspace) -> None:
    driver = fs_workspace.kafka_driver(kafka_broker.bootstrap_servers, "no-such-topic", "--stop-when-idle").start()
    assert driver.wait() == contract.EXIT_MISCONFIGURED, driver.output()[-3000:]
    assert driver.termination_message().startswith(
        f"source 'words': topic 'no-such-topic' does not exist on the Kafka cluster at {kafka_broker.bootstrap_servers}: "
        "create it")
