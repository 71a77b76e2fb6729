"""The Kafka source's pure parts: a message's value as a record (or a dead letter with its
reason), the gap of offsets retention removed, lag, Spark's loss report in our words, and
the two clients' settings of a connection."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from spark_app.contract import KafkaConnection
from spark_app.persistence import Backend
from spark_app.runtime.driver import last_progress, query_lag
from spark_app.runtime.kafka_clients import (
    TopicPartition,
    client_config,
    offsets_json,
    parse_offsets,
    spark_options,
)
from spark_app.runtime.sources.dead_letters import kafka_origin, write_dead_letters
from spark_app.runtime.sources.kafka import (
    Gap,
    KafkaDataLost,
    KafkaSourceSpec,
    KafkaTracker,
    MessagePlan,
    PendingLetters,
    RejectedMessage,
    data_lost,
    data_lost_in_spark,
    gaps,
    lag,
)
from spark_app.runtime.sources.parsing import CsvFormat, parse_messages
from spark_app.state.identity import Manifest, SourceIdentity, compare

WORDS = pa.schema([("word", pa.string()), ("n", pa.int32())])
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def test_each_json_message_is_one_record_and_the_others_are_set_aside_with_the_reason() -> None:
    values = [b'{"word": "a", "n": 1}', b'{"word": "b",\n "n": 2}', None, b" ", b'{"word": "c", "n": "x"}',
              b"[1]", b'{"word": "d", "n": 4} {"word": "e", "n": 5}', b"not json", b'{"n": 7, "extra": true}']
    parsed = parse_messages(values, WORDS, "json")
    assert parsed.table.to_pylist() == [{"word": "a", "n": 1}, {"word": "b", "n": 2}, {"word": None, "n": 7}]
    assert parsed.kept == [0, 1, 8]
    assert parsed.rejected == {
        2: "the message has no value (a tombstone)",
        3: "the message's value is empty",
        4: "column 'n': cannot read 'x' as INT",
        5: "expected a JSON object, found list",
        6: "holds 2 records; a message must hold one",
        7: "not valid JSON: Expecting value at column 1",
    }
    # A message `null` first in its run once killed the parser's process (pyarrow).
    nulls = parse_messages([b"null", b'{"word": "a", "n": 1}', b" null"], WORDS, "json")
    assert (nulls.kept, nulls.rejected) == ([1], {0: "expected a JSON object, found null",
                                                  2: "expected a JSON object, found null"})


def test_each_csv_message_is_one_record_in_schema_order() -> None:
    values = [b"a,1\n", b"b;2", b"c,x", b"d,1,2", b'"e\nf",3', b'"g, h",7']
    parsed = parse_messages(values, WORDS, "csv", CsvFormat(header=False))
    assert parsed.table.to_pylist() == [{"word": "a", "n": 1}, {"word": "g, h", "n": 7}]
    assert parsed.rejected == {1: "expected 2 fields, found 1", 2: "column 'n': cannot read 'x' as INT",
                               3: "expected 2 fields, found 3", 4: "a CSV message must hold one record on one line"}
    assert parse_messages(values[1:2], WORDS, "csv", CsvFormat(header=False, delimiter=";")).kept == [0]


def test_offsets_are_spark_s_json_both_ways() -> None:
    offsets = parse_offsets('{"t": {"1": 5, "0": 12}}')
    assert offsets == {T0: 12, T1: 5}
    assert offsets_json(offsets) == {"t": {"0": 12, "1": 5}}


def test_the_gap_is_what_lies_below_a_partition_s_first_stored_offset() -> None:
    start, end = {T0: 10, T1: 4}, {T0: 30, T1: 9, TopicPartition("t", 2): 5}
    # t-0 lost 10..14; t-1 lost all it had to read and more is gone; t-2 is new and starts at 3.
    found = gaps(start, end, {T0: 15, T1: 20, TopicPartition("t", 2): 3})
    assert found == [Gap(T0, 10, 15), Gap(T1, 4, 9), Gap(TopicPartition("t", 2), 0, 3)]
    assert gaps(start, end, {T0: 10, T1: 0}) == []


def test_lost_offsets_stop_the_driver_with_the_partition_the_gap_and_the_way_out() -> None:
    message = str(data_lost("clicks", Gap(T0, 10, 15)))
    assert message.startswith("source 'clicks': offsets 10 to 14 of topic 't' partition 0 (5 offsets) are gone")
    assert "committed up to offset 10 and the partition now starts at 15" in message
    assert "fail_on_data_loss=False" in message


def test_spark_s_own_loss_report_is_put_in_our_words() -> None:
    spark = ("[KAFKA_DATA_LOSS.COULD_NOT_READ_OFFSET_RANGE] Some data may have been lost because they are not "
             "available in Kafka any more; ... Could not read records in offset [7, 12) for topic partition t-0 "
             "with consumer group spark-kafka-source-x.")
    lost = data_lost_in_spark(["clicks"], spark)
    assert lost is not None and "offsets 7 to 11 of topic partition t-0 are gone" in str(lost)
    assert data_lost_in_spark(["clicks"], "java.net.ConnectException: Connection refused") is None


def test_lag_is_what_each_partition_holds_beyond_the_committed_offset() -> None:
    assert lag({T0: 30, T1: 9}, {T0: 25}) == {"t": {"0": 5, "1": 9}}


def test_credentials_reach_the_clients_settings_and_nothing_else() -> None:
    connection = KafkaConnection("k:9093", "SASL_SSL", "SCRAM-SHA-512", "app", 'pa"ss', "/ca.pem")
    options = spark_options(connection)
    assert options["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="app" password="pa\\"ss";')
    assert options["kafka.ssl.truststore.type"] == "PEM" and options["kafka.ssl.truststore.location"] == "/ca.pem"
    config = client_config(connection)
    assert (config["security.protocol"], config["sasl.password"], config["ssl.ca.location"]) == (
        "sasl_ssl", 'pa"ss', "/ca.pem")
    assert spark_options(KafkaConnection("k:9092")) == {"kafka.bootstrap.servers": "k:9092",
                                                        "kafka.security.protocol": "PLAINTEXT"}


@pytest.mark.parametrize(("old", "new", "compatible"), [
    ("kafka/json", "kafka/csv", True), ("csv", "jsonlines", True), ("csv", "kafka/json", False),
    ("kafka/raw", "jsonlines", False)])
def test_a_source_may_change_its_format_but_not_between_files_and_kafka(old: str, new: str, compatible: bool) -> None:
    def manifest(fmt: str) -> Manifest:
        return Manifest(sources={"s": SourceIdentity("s", fmt, "struct<word:string>", "/in")})

    changes = compare(manifest(old), manifest(new), committed=set())
    assert [c.compatible for c in changes] == [compatible]


class ListedOffsets:
    """What an admin client would list: each partition's first and next offsets."""

    def __init__(self, earliest: dict[TopicPartition, int], latest: dict[TopicPartition, int]) -> None:
        self._earliest, self._latest = earliest, latest

    def earliest(self, partitions: object) -> dict[TopicPartition, int]:
        return dict(self._earliest)

    def latest(self, partitions: object) -> dict[TopicPartition, int]:
        return dict(self._latest)

    def partitions(self, topics: object) -> list[TopicPartition]:
        return sorted(self._latest, key=str)


def tracker(tmp_path: Path, admin: ListedOffsets, skip_loss: bool = False,
            pending: PendingLetters | None = None) -> KafkaTracker:
    spec = KafkaSourceSpec("clicks", KafkaConnection("k:9092"), topics=("t",), fail_on_data_loss=not skip_loss)
    return KafkaTracker(spec, Backend.filesystem(str(tmp_path)), admin, pending)  # type: ignore[arg-type]


def test_the_tracker_counts_offsets_set_aside_messages_and_skipped_ones(tmp_path: Path) -> None:
    letters = Backend.filesystem(str(tmp_path)).storage()
    for offset in (12, 13, 40):  # 40: a later batch's
        write_dead_letters(letters, "clicks", kafka_origin("t", 0, offset), [{"kind": "row", "offset": offset}])
    skipping = tracker(tmp_path, ListedOffsets({T0: 12, T1: 0}, {T0: 30, T1: 9}), skip_loss=True)
    start, end = {"t": {"0": 10, "1": 4}}, {"t": {"0": 30, "1": 9}}
    assert skipping.unreadable(start, end) == {"lost": 2}
    assert skipping.unreadable(None, end) == {"lost": 0}  # a first batch starts where Spark chose
    assert skipping.counters({"offsets": 14, "malformed": 1, "lost": 3}, start, end) == {
        "offsets": 14 + 20 + 5, "malformed": 3, "lost": 3}
    assert skipping.describe(end) == '{"t":{"0":30,"1":9}}'
    with pytest.raises(KafkaDataLost, match="offsets 10 to 11 of topic 't' partition 0"):
        tracker(tmp_path, ListedOffsets({T0: 12, T1: 0}, {})).unreadable(start, end)


def messages_read(topic: str, partition: int, first: int, values: list[bytes]) -> pa.RecordBatch:
    """Rows of Spark's Kafka source, as a task reads them: offsets first, first + 1, ..."""
    return pa.RecordBatch.from_pydict({
        "key": [None] * len(values), "value": values, "topic": [topic] * len(values),
        "partition": [partition] * len(values), "offset": list(range(first, first + len(values))),
        "timestamp": [0] * len(values), "timestampType": [0] * len(values),
    })


def test_each_bad_message_is_set_aside_once_however_the_queries_cut_its_partition(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two queries read one source (one per output), each batch by batch from its own
    offsets: one read offsets 7 to 14 of partition 2 (13 and 14 malformed) in one batch,
    the other 7 to 12, then 13 to 14. Each bad message is one dead letter, counted once in
    the batch of each query that read it. (Named by the first offset a task read, both
    queries' letters were kept: the kill -9 test found a bad message twice.)"""
    from spark_app.runtime.sources import kafka as kafka_source

    backend = Backend.filesystem(str(tmp_path))
    monkeypatch.setattr(kafka_source, "_dead_letter_backend", lambda: backend)
    good = [b'{"word": "a", "n": 1}'] * 6
    bad = [b'{"word": "w1", "n": "five"}', b"not json"]
    parse = kafka_source.ParseMessages(
        kafka_source.MessagePlan("clicks", "json", WORDS, (), CsvFormat(header=False)))
    list(parse([messages_read("t", 2, 7, good + bad)]))      # one query's batch: 7 to 14
    list(parse([messages_read("t", 2, 7, good)]))            # the other's: 7 to 12,
    list(parse([messages_read("t", 2, 13, bad)]))            # then 13 to 14

    letters = [json.loads(line) for path in sorted(tmp_path.rglob("*.jsonl")) for line in path.read_text().splitlines()]
    assert sorted((r["topic"], r["partition"], r["offset"], r["raw"]) for r in letters) == [
        ("t", 2, 13, bad[0].decode()), ("t", 2, 14, bad[1].decode())]
    counting = tracker(tmp_path, ListedOffsets({}, {}))
    t2 = TopicPartition("t", 2)
    assert counting.counters({}, offsets_json({t2: 7}), offsets_json({t2: 15}))["malformed"] == 2
    cut = counting.counters({}, offsets_json({t2: 7}), offsets_json({t2: 13}))
    assert cut["malformed"] == 0
    assert counting.counters(cut, offsets_json({t2: 13}), offsets_json({t2: 15}))["malformed"] == 2


def test_what_the_jvm_set_aside_is_one_letter_a_message_with_the_parser_s_reason_before_it_is_counted(
        tmp_path: Path) -> None:
    """The JVM's JSON parse hands the driver what it did not keep; the commit of a query's
    batch writes the letters, then counts them. Two queries read the source: the second
    hands over offset 13 again, which stays one letter."""
    five = b'{"word": "w1", "n": "five"}'
    handed = [[RejectedMessage("t", 2, 13, five, len(five)), RejectedMessage("t", 2, 14, None, -1)],
              [RejectedMessage("t", 2, 13, five, len(five)), RejectedMessage("t", 2, 15, b'{"word": "w\xff"}', 14),
               RejectedMessage("t", 2, 16, b'{"word": "a', 5_000_000)]]  # a 5 MB value, its first MiB kept
    pending = PendingLetters(MessagePlan("clicks", "json", WORDS, (), CsvFormat(header=False)),
                             "struct<word:string,n:int>", lambda: handed.pop(0) if handed else [])
    counting = tracker(tmp_path, ListedOffsets({}, {}), pending=pending)
    t2 = TopicPartition("t", 2)
    first = counting.counters({}, offsets_json({t2: 7}), offsets_json({t2: 15}))
    assert first["malformed"] == 2
    assert counting.counters(first, offsets_json({t2: 15}), offsets_json({t2: 17}))["malformed"] == 4

    letters = [json.loads(line) for path in sorted(tmp_path.rglob("*.jsonl")) for line in path.read_text().splitlines()]
    assert [(r["offset"], r["raw"], r["error"]) for r in letters] == [
        (13, five.decode(), "column 'n': cannot read 'five' as INT"),
        (14, None, "the message has no value (a tombstone)"),
        (15, '{"word": "w\ufffd"}', "is not valid UTF-8 (byte 0xff at column 12)"),
        (16, '{"word": "a', "not one JSON object that Spark's JSON reader reads as struct<word:string,n:int>"),
    ]


def test_the_tracker_is_caught_up_when_every_partition_s_records_are_committed(tmp_path: Path) -> None:
    listed = ListedOffsets({}, {T0: 30, T1: 9})
    assert tracker(tmp_path, listed).caught_up({"t": {"0": 30, "1": 9}})
    assert not tracker(tmp_path, listed).caught_up({"t": {"0": 30, "1": 8}})
    assert not tracker(tmp_path, listed).caught_up({"t": {"0": 30}})  # a partition added since
    assert not tracker(tmp_path, listed).caught_up(None)


def test_lag_names_each_kafka_source_of_a_query_by_its_place_in_spark_s_progress() -> None:
    # A file source and two topics, as Spark's progress lists them: latest offsets (JSON
    # objects, as Spark's progress JSON has them), the file source's naming itself.
    progress = {"sources": [{"latestOffset": {"clicks": {"0": 40, "1": 7}}},
                            {"latestOffset": {"source": "words", "files": 3}},
                            {"latestOffset": {"views": {"0": 5}}}]}
    committed = {"clicks_topic": {"clicks": {"0": 38, "1": 7}}, "words": {"source": "words", "files": 2}}
    lagging = query_lag("q", ("clicks_topic", "words", "views_topic"), {"clicks_topic", "views_topic"}, progress,
                        committed)
    assert lagging == {"clicks_topic": {"clicks": {"0": 2, "1": 0}}, "views_topic": {"views": {"0": 5}}}
    assert query_lag("q", ("words",), set(), progress, committed) == {}


def test_lag_reads_the_progress_pyspark_gives_a_running_query() -> None:
    """pyspark's lastProgress turns each source's offsets into str() of the parsed JSON
    (Python's repr, single quotes), which is no offset line; make demo's Kafka pipeline
    failed every report on it. The lag reads Spark's own JSON instead."""
    from types import SimpleNamespace

    from pyspark.sql.streaming.listener import StreamingQueryProgress

    spark_json = {"id": "7f4f3a4e-0000-4000-8000-000000000001", "runId": "7f4f3a4e-0000-4000-8000-000000000002",
                  "name": "q", "timestamp": "2026-11-24T15:31:44.553Z", "batchId": 0, "batchDuration": 8413,
                  "numInputRows": 50000, "inputRowsPerSecond": 0.0, "processedRowsPerSecond": 5943.2,
                  "stateOperators": [], "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
                  "sources": [{"description": "KafkaV2[Subscribe[clicks]]", "startOffset": None,
                               "endOffset": {"clicks": {"0": 38}}, "latestOffset": {"clicks": {"0": 40}},
                               "numInputRows": 38, "inputRowsPerSecond": 0.0, "processedRowsPerSecond": 4.5}]}
    query = SimpleNamespace(lastProgress=StreamingQueryProgress.fromJson(spark_json))
    progress = last_progress(query)
    assert query_lag("q", ("clicks_topic",), {"clicks_topic"}, progress,
                     {"clicks_topic": {"clicks": {"0": 38}}}) == {"clicks_topic": {"clicks": {"0": 2}}}
    assert progress["inputRowsPerSecond"] == 0.0
    assert last_progress(SimpleNamespace(lastProgress=None)) == {}
