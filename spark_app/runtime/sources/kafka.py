"""A Kafka source: Spark's own Kafka source (per-partition offsets, bounded batches, new
partitions picked up), its records parsed in Spark's tasks.

Offsets. Spark's Kafka offset (``{"topic": {"0": 42}}``, the next offset of each partition)
names no source, so the commit maps the lines of Spark's offset log to persistent ids by
their position among the query's sources (commit.offsets_by_source), and stores each
under its persistent id with the batch. A
restart resumes from there: Spark's checkpoint is committed batch by batch with the
metadata log, and a batch that Spark planned and spark_app did not commit runs again with
the same offsets. No consumer group is involved: Spark's source commits none, and
spark_app never reads one.

Parsing. A message's value is one record (JSON object, CSV record without a header, or the
raw bytes); what does not fit goes to the dead letters with topic, partition, offset and the
reason (one object per message, named by its offset, spark_app.runtime.sources.dead_letters).
JSON is read in the JVM by Spark's reader (spark_app.runtime.jvm.json_messages): the
messages it does not keep reach the driver with the tasks' results, and ``PendingLetters``
writes their letters in the batch's commit, before it counts them. CSV is read in Python
workers: ``ParseMessages`` runs in each task over Arrow batches and writes the letters at
the task's end, to the location the driver set as a local property of the query's jobs
(``DEAD_LETTER_PROPERTY``) once it knew it.

Data loss. Offsets that retention (or a deletion) removed before they were read are found
by the commit (``KafkaTracker.unreadable``), which lists each partition's first stored
offset before the batch's output is written:
by default the driver stops with ``KafkaDataLost`` naming topic, partition and the gap;
with ``fail_on_data_loss=False`` Spark skips them and the commit counts them (``lost``).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_app.contract import KafkaConnection
from spark_app.persistence import Backend
from spark_app.runtime.kafka_clients import (
    Admin,
    PartitionOffsets,
    TopicPartition,
    parse_offsets,
    spark_options,
)
from spark_app.runtime.sources.base import Offset
from spark_app.runtime.sources.dead_letters import kafka_origin, kafka_origins, write_dead_letters
from spark_app.runtime.sources.parsing import CsvFormat, parse_messages

FORMAT = "kafka"
VALUE_FORMATS = ("json", "csv", "raw")
METADATA_COLUMNS = ("key", "headers", "topic", "partition", "offset", "timestamp")
"""Columns of Spark's Kafka source a pipeline may keep beside the value's."""
STARTING_OFFSETS = ("earliest", "latest")
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 100_000
"""Offsets one batch reads over all partitions: a backlog drains in bounded batches. Spark
splits them in proportion to what each partition holds, rounding a share below one up (no
partition starves), so a batch may read up to one offset more per partition."""
DEAD_LETTER_PROPERTY = "spark_app.dead_letter"
"""A local property of the query's jobs: the dead-letter Backend as JSON."""
log = logging.getLogger("spark_app")

RAW_DECODE_LIMIT = 4096
"""A rejected message's value is kept as text up to this many bytes."""


class KafkaTopicMissing(Exception):
    """A topic a source names does not exist on its cluster."""


class KafkaDataLost(Exception):
    """Records a source had not read are gone from Kafka, and the source may not skip them."""


@dataclass(frozen=True)
class KafkaSourceSpec:
    """A Kafka source as the pipeline declared it; the connection holds its credentials."""

    persistent_id: str
    connection: KafkaConnection
    """Its password, if any, is left out of the repr."""
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    value_format: str = "json"
    schema: str | None = None
    """The value's Spark DDL schema (json and csv)."""
    columns: tuple[str, ...] = ()
    """METADATA_COLUMNS kept beside the value's."""
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int = DEFAULT_MAX_OFFSETS_PER_TRIGGER
    fail_on_data_loss: bool = True
    csv: CsvFormat = CsvFormat(header=False)

    @property
    def location(self) -> str:
        """What the source reads, for the stored state's identity (no credentials)."""
        what = f"pattern:{self.pattern}" if self.pattern else ",".join(self.topics)
        return f"kafka://{self.connection.bootstrap_servers}/{what}"

    def reader_options(self) -> dict[str, str]:
        options = {
            **spark_options(self.connection),
            # Records of aborted transactions (a writer that died, a fenced one) are never read.
            "kafka.isolation.level": "read_committed",
            "startingOffsets": self.starting_offsets,
            "maxOffsetsPerTrigger": str(self.max_offsets_per_trigger),
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            "includeHeaders": str("headers" in self.columns).lower(),
            # Names the relation in the plan: offsets are mapped to sources by position.
            "persistent_id": self.persistent_id,
        }
        if self.pattern:
            options["subscribePattern"] = self.pattern
        else:
            options["subscribe"] = ",".join(self.topics)
        return options


@dataclass(frozen=True)
class MessagePlan:
    """What a task needs to parse messages; pickled into the query's plan."""

    persistent_id: str
    value_format: str
    value_schema: pa.Schema
    """The value's columns (empty for raw: the value itself is the column)."""
    columns: tuple[str, ...]
    csv: CsvFormat


class ParseMessages:
    """mapInArrow's function over Spark's Kafka rows (key, value, topic, partition, offset,
    timestamp, timestampType[, headers]): the records of the values, with the metadata
    columns kept; the rest set aside in the dead letters at the end of the task."""

    def __init__(self, plan: MessagePlan) -> None:
        self.plan = plan

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rejected: list[dict[str, Any]] = []
        for batch in batches:
            yield from self._parse(batch, rejected)
        if rejected:
            storage = _dead_letter_backend().storage()
            for record in rejected:
                origin = kafka_origin(record["topic"], record["partition"], record["offset"])
                write_dead_letters(storage, self.plan.persistent_id, origin, [record])

    def _parse(self, batch: pa.RecordBatch, rejected: list[dict[str, Any]]) -> Iterator[pa.RecordBatch]:
        plan = self.plan
        values = batch.column("value").to_pylist()
        parsed = parse_messages(values, plan.value_schema, plan.value_format, plan.csv)
        if parsed.rejected:
            topics = batch.column("topic").to_pylist()
            partitions = batch.column("partition").to_pylist()
            offsets = batch.column("offset").to_pylist()
            for index, error in parsed.rejected.items():
                rejected.append({
                    "kind": "row", "topic": topics[index], "partition": partitions[index], "offset": offsets[index],
                    "raw": _text(values[index]), "error": error,
                })
        if parsed.table.num_rows:
            yield from _with_columns(parsed.table, batch, plan.columns, parsed.kept)


@dataclass(frozen=True)
class RejectedMessage:
    """A message the JVM's JSON parse set aside, as it reached the driver."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    """The value (its first MiB), or None for a tombstone."""
    length: int
    """The value's whole length in bytes."""


class PendingLetters:
    """The dead letters of a JSON source's messages that the JVM set aside, written on the
    driver. Every query that reads the source (one per output) hands over what its tasks
    set aside; whichever commit comes first writes the letters of all of them, under a lock,
    so that a commit that counts its batch's letters never finds one half written."""

    def __init__(self, plan: MessagePlan, schema_ddl: str, drain: Callable[[], list[RejectedMessage]]) -> None:
        self._plan = plan
        self._ddl = schema_ddl
        self._drain = drain
        self._lock = threading.Lock()

    def write(self, dead_letter: Backend) -> None:
        with self._lock:
            messages = {(m.topic, m.partition, m.offset): m for m in self._drain()}
            if not messages:
                return
            storage = dead_letter.storage()
            for (topic, partition, offset), message in sorted(messages.items()):
                record = {"kind": "row", "topic": topic, "partition": partition, "offset": offset,
                          "raw": _text(message.value), "error": self.reason(message)}
                write_dead_letters(storage, self._plan.persistent_id, kafka_origin(topic, partition, offset), [record])

    def reason(self, message: RejectedMessage) -> str:
        """Why the message was set aside: the Python parser's words, which name the field
        and the value; where that parser would have kept it, Spark's reader's verdict."""
        value = message.value
        if value is None:
            return "the message has no value (a tombstone)"
        if message.length == len(value):  # whole
            parsed = parse_messages([value], self._plan.value_schema, "json")
            if parsed.rejected:
                return parsed.rejected[0]
        return f"not one JSON object that Spark's JSON reader reads as {self._ddl}"


def _with_columns(values: pa.Table, batch: pa.RecordBatch, columns: tuple[str, ...],
                  kept: list[int] | None) -> Iterator[pa.RecordBatch]:
    table = values
    if columns:
        metadata = pa.Table.from_batches([batch.select(list(columns))])
        if kept is not None:
            metadata = metadata.take(pa.array(kept, pa.int64()))
        for name in columns:
            table = table.append_column(name, metadata.column(name))
    return table.combine_chunks().to_batches()


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    return value[:RAW_DECODE_LIMIT].decode("utf-8", "replace")


def _dead_letter_backend() -> Backend:
    from pyspark import TaskContext

    context = TaskContext.get()
    raw = context.getLocalProperty(DEAD_LETTER_PROPERTY) if context is not None else None
    if not raw:
        raise RuntimeError(
            "spark_app Kafka sources only run under spark_app.run(): start the pipeline with sa.run(...) "
            "rather than starting Spark streaming queries by hand"
        )
    return Backend.from_json(json.loads(raw))


# ---- the commit's side: caught up, loss, counters, lag ----------------------------------------


class KafkaTracker:
    """A Kafka source in its queries' commits (spark_app.runtime.sources.base.Tracker):
    caught up when the committed offsets reach every partition's last stable offset;
    counters of offsets read, messages set aside and offsets lost to retention."""

    def __init__(self, spec: KafkaSourceSpec, dead_letter: Backend, admin: Admin | None = None,
                 pending: PendingLetters | None = None) -> None:
        self._spec = spec
        self._admin = admin or Admin(spec.connection)
        self._dead_letter = dead_letter
        self._pending = pending

    def check_topics(self) -> None:
        """At start: the topics the source names exist (a pattern waits for its topics)."""
        if not self._spec.topics:
            return
        known = self._admin.topics()
        missing = [topic for topic in self._spec.topics if topic not in known]
        if missing:
            names = ", ".join(repr(topic) for topic in missing)
            raise KafkaTopicMissing(
                f"source {self._spec.persistent_id!r}: topic {names} does not exist on the Kafka cluster at "
                f"{self._spec.connection.bootstrap_servers}: create it (kafka-topics.sh --create --topic ...) or "
                "correct the name; to wait for topics that do not exist yet, read a pattern "
                "(sa.io.kafka.read(pattern=...))")

    def caught_up(self, committed: Offset | None) -> bool:
        done = parse_offsets(committed or {})
        if not done:
            return False
        # Partitions added since the last batch count too (with a pattern, those of the
        # topics read so far; Spark's own check covers new topics).
        topics = self._spec.topics or sorted({tp.topic for tp in done})
        latest = self._admin.latest(self._admin.partitions(topics))
        return all(offset <= done.get(tp, 0) for tp, offset in latest.items())

    def unreadable(self, start: Offset | None, end: Offset) -> dict[str, int]:
        """Offsets of [start, end) that retention removed before the batch ran. A query's
        first batch (no ``start``) begins where Spark chose, from the offsets it listed then."""
        if start is None:
            return {"lost": 0}
        until = parse_offsets(end)
        found = gaps(parse_offsets(start), until, self._admin.earliest(until))
        if found and self._spec.fail_on_data_loss:
            raise data_lost(self._spec.persistent_id, found[0])
        for gap in found:
            log.warning("source %s: offsets %d to %d of %s were gone before they were read; skipped",
                        self._spec.persistent_id, gap.start, gap.first - 1, gap.partition)
        return {"lost": sum(gap.size for gap in found)}

    def counters(self, previous: Mapping[str, int], start: Offset | None, end: Offset) -> dict[str, int]:
        if self._pending is not None:
            # Before they are counted, and before the commit that makes the batch final.
            self._pending.write(self._dead_letter)
        first, until = parse_offsets(start or {}), parse_offsets(end)
        pid = self._spec.persistent_id
        # One object per message set aside: counted by their names, not read.
        set_aside = sum(len(kafka_origins(self._dead_letter, pid, tp.topic, tp.partition, first.get(tp, 0), stop))
                        for tp, stop in until.items())
        return {
            "offsets": previous.get("offsets", 0) + sum(stop - first.get(tp, 0) for tp, stop in until.items()),
            "malformed": previous.get("malformed", 0) + set_aside,
            "lost": previous.get("lost", 0),
        }

    def describe(self, offset: Offset) -> str:
        """The next offset of each partition, as Spark logs it: {"topic":{"0":42}}."""
        return json.dumps(offset, separators=(",", ":"), sort_keys=True)



@dataclass(frozen=True)
class Gap:
    """Offsets [start, first) of a partition that were gone when its batch ran."""

    partition: TopicPartition
    start: int
    first: int

    @property
    def size(self) -> int:
        return self.first - self.start


def gaps(start: PartitionOffsets, end: PartitionOffsets, earliest: Mapping[TopicPartition, int]) -> list[Gap]:
    """What a batch reading [start, end) could not read: for each partition, the offsets
    below its first stored one. A partition new in this batch starts at 0."""
    found = []
    for tp, until in sorted(end.items(), key=lambda item: (item[0].topic, item[0].partition)):
        begin = start.get(tp, 0)
        first = min(earliest.get(tp, begin), until)
        if first > begin:
            found.append(Gap(tp, begin, first))
    return found


def data_lost(persistent_id: str, gap: Gap) -> KafkaDataLost:
    return KafkaDataLost(
        f"source {persistent_id!r}: offsets {gap.start} to {gap.first - 1} of topic {gap.partition.topic!r} "
        f"partition {gap.partition.partition} ({gap.size} offsets) are gone from Kafka before they were read "
        "(retention or a deletion removed them while the pipeline was down or behind): the pipeline committed up "
        f"to offset {gap.start} and the partition now starts at {gap.first}. To skip them and carry on, set "
        "fail_on_data_loss=False on the source (they are counted as lost); or reset the pipeline's state"
    )


_SPARK_LOSS = re.compile(
    r"(?:offset \[(?P<start>\d+), (?P<end>\d+)\) for topic partition (?P<tp>\S+?)[ .,]"
    r"|Added partition (?P<added>\S+) starts from (?P<from>\d+))")
_LOSS_MARKERS = ("failOnDataLoss", "COULD_NOT_READ_OFFSET_RANGE", "KAFKA_DATA_LOSS", "Some data may have been")


def data_lost_in_spark(persistent_ids: Iterable[str], message: str) -> KafkaDataLost | None:
    """Spark's own report of lost offsets (its tasks found the gap first), in our words."""
    if not any(marker in message for marker in _LOSS_MARKERS):
        return None
    names = ", ".join(repr(p) for p in persistent_ids)
    found = _SPARK_LOSS.search(message)
    if found and found.group("tp"):
        where = (f"offsets {found.group('start')} to {int(found.group('end')) - 1} of topic partition "
                 f"{found.group('tp')}")
    elif found:
        where = f"offsets 0 to {int(found.group('from')) - 1} of the new partition {found.group('added')}"
    else:
        where = "offsets it had not read"
    return KafkaDataLost(
        f"Kafka source {names}: {where} are gone from Kafka before they were read (retention or a deletion "
        "removed them). To skip them and carry on, set fail_on_data_loss=False on the source (they are counted "
        f"as lost); or reset the pipeline's state. Spark said: {message.strip().splitlines()[0][:300]}"
    )


def lag(latest: PartitionOffsets, committed: PartitionOffsets) -> dict[str, dict[str, int]]:
    """Records each partition holds beyond the committed offsets, as {topic: {partition: n}}."""
    out: dict[str, dict[str, int]] = {}
    for tp, end in sorted(latest.items(), key=lambda item: (item[0].topic, item[0].partition)):
        out.setdefault(tp.topic, {})[str(tp.partition)] = max(0, end - committed.get(tp, 0))
    return out
