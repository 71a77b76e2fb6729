"""A changelog written to a Kafka topic exactly once: one transaction per batch.

Each change of the query's result is one message: the value is the changelog line (the
row's JSON object with ``time`` and ``diff``), the key the JSON array of the key columns'
values (so that every change of a key lands in one partition, in order), or none.

Exactly once, across kill -9 and stale drivers:

* The producer's ``transactional.id`` is derived from the stored state and the output
  (``spark_app-<state id>-<output>``), the same for every driver of the pipeline. A driver
  calls ``init_transactions`` when it starts: the broker aborts what an earlier driver left
  open and bumps the producer epoch, so a superseded driver (frozen, partitioned) is fenced
  by the broker at its next send or commit.
* Inside the batch's transaction, with its messages, the producer commits a marker: the
  offset ``batch + 1`` of the output topic's partition 0 for a consumer group named like
  the transactional id (``send_offsets_to_transaction``). The marker commits or aborts with
  the messages. Partition 0 of the output topic needs no topic of its own (nor the right to
  create one); nobody consumes with that group.
* The Kafka transaction commits in ``write``, before the metadata-log commit. A driver
  killed between the two leaves a batch in Kafka that the metadata log does not hold; the
  next driver replays it (same input, same state, same changes) and, finding the marker at
  or past the batch, produces nothing: it only commits the batch in the metadata log.

Read the topic with ``isolation.level=read_committed``: an aborted transaction's messages
(a driver that died mid-batch, a fenced one) are in the log but never delivered.

A keyed output's state (the row last emitted for each key) comes back after a restart from
its last snapshot plus the changes of the batches committed since, which the output stores
beside its snapshots (``outputs/<name>/changes/<batch>.jsonl``) until a snapshot covers them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from spark_app.contract import KafkaConnection
from spark_app.faults import AFTER_KAFKA_COMMIT, IN_KAFKA_TRANSACTION, crash_point
from spark_app.runtime.kafka_clients import CLIENT_TIMEOUT_S, client_config
from spark_app.runtime.sinks.base import Batch, KeyedOutput, OutputContext
from spark_app.runtime.sinks.changelog import chunks, keyed_changes
from spark_app.runtime.sinks.keyed_state import OutputState
from spark_app.state.records import OutputHead
from spark_app.state.session import Fenced
from spark_app.storage import NotFound, Storage, join

log = logging.getLogger("spark_app")

TRANSACTION_TIMEOUT_MS = 300_000
"""How long the broker lets a batch's transaction stay open before aborting it. A driver
that dies mid-batch leaves its transaction open (holding back read_committed readers of
the topic) until its successor's ``init_transactions`` aborts it, or this long."""
MARKER_PARTITION = 0


class KafkaOutput(KeyedOutput):
    """The query's changelog as messages of ``topic`` (see the module's docstring)."""

    def __init__(self, name: str, topic: str, key: Sequence[str] | None, message_key: Sequence[str] | None,
                 connection: KafkaConnection) -> None:
        super().__init__(name, f"kafka://{connection.bootstrap_servers}/{topic}", key)
        self.topic = topic
        self._message_key = tuple(key or message_key or ())
        self._connection = connection
        self._head = OutputHead(position=-1, rows=0)
        self._producer: Any = None
        self._marker_consumer: Any = None
        self._failure: Any = None
        """The first delivery error of the batch in flight."""
        self._in_kafka = -1
        """The last batch whose transaction Kafka committed (the marker, less one)."""
        self._snapshots: Storage | None = None
        self.transactional_id = ""

    # ---- start-up ----------------------------------------------------------------------

    def recover(self, head: OutputHead | None, context: OutputContext) -> None:
        from confluent_kafka import Consumer, Producer

        self._head = head or OutputHead(position=-1, rows=0)
        self._snapshots = context.snapshots
        self._epoch = context.epoch
        self.transactional_id = f"spark_app-{context.state_id}-{self.name}"
        self._producer = Producer({
            **client_config(self._connection),
            "transactional.id": self.transactional_id,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "linger.ms": 20,
        })
        # Fences every earlier producer of this id, and ends what it left open: its
        # transaction is aborted, or completed if it had asked for the commit already.
        self._call(self._producer.init_transactions, CLIENT_TIMEOUT_S * 4)
        # For the group's metadata and its committed marker: it never subscribes, so it
        # never joins the group.
        self._marker_consumer = Consumer({**client_config(self._connection), "group.id": self.transactional_id,
                                          "isolation.level": "read_committed"})
        self._in_kafka = self._marker() - 1
        log.info("output %s: transactional id %s; Kafka holds batches up to %d, the metadata log up to %d",
                 self.name, self.transactional_id, self._in_kafka, self._head.position)
        if self._state is not None:
            snapshots, after = context.snapshots, self._head.position

            def rebuild() -> None:
                self._rebuild_state(snapshots)
                self._remove_changes(snapshots, after=after)

            self._restore_state(rebuild)

    def _marker(self) -> int:
        """The marker's offset (0: no batch committed in Kafka yet), once any transaction in
        flight has ended (read_committed: the fetch requires stable offsets).

        Read through the group's own consumer, not an admin client: librdkafka's admin
        ListConsumerGroupOffsets dereferences the client's absent consumer group when the
        broker answers NOT_COORDINATOR (a group coordinator still loading, as on a broker
        just started), killing the driver with SIGSEGV in librdkafka's thread, where signals
        are blocked and faulthandler cannot report it (librdkafka#5040). The consumer looks
        the coordinator up again; its answer, retriable, is asked again until the deadline."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        wanted = [TopicPartition(self.topic, MARKER_PARTITION)]
        deadline = time.monotonic() + CLIENT_TIMEOUT_S * 4
        while True:
            try:
                (found,) = self._marker_consumer.committed(wanted, timeout=CLIENT_TIMEOUT_S)
            except KafkaException as error:
                kafka_error = error.args[0] if error.args else None
                coordinator_moving = isinstance(kafka_error, KafkaError) and kafka_error.code() in (
                    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                    KafkaError.COORDINATOR_NOT_AVAILABLE)  # retriable in Kafka's protocol
                if coordinator_moving and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise KafkaWriteFailed(f"output {self.name}: reading the marker of group "
                                       f"{self.transactional_id} failed: {kafka_error}") from None
            if found.error is not None:
                raise KafkaWriteFailed(f"output {self.name}: reading the marker of group {self.transactional_id} "
                                       f"failed: {found.error}")
            return max(0, int(found.offset))

    def _rebuild_state(self, snapshots: Storage) -> None:
        assert self._state is not None and self.key is not None
        self._state.close()  # a query restarted in this driver starts over too
        self._state = OutputState(self.key)
        snap = self._head.snapshot
        since = -1
        if snap is not None:
            try:
                self._state.restore_from(snapshots, snap.key)
                since = snap.batch
            except NotFound:
                log.warning("output %s: snapshot %s is missing; replaying every stored change", self.name, snap.key)
        replayed = 0
        for batch_id, key in self._change_files(snapshots):
            if since < batch_id <= self._head.position:
                replayed += self._state.apply_changelog(snapshots.read(key).splitlines())
        log.info("output %s: state of %d keys restored (snapshot at batch %d, %d changes replayed)",
                 self.name, len(self._state), since, replayed)

    # ---- a batch -----------------------------------------------------------------------

    def write(self, batch: Batch) -> OutputHead:
        """Produces the batch's changes in one Kafka transaction and commits it, or, for a
        batch Kafka holds already, only works out its changes (the keyed state needs them)."""
        in_kafka = batch.batch_id <= self._in_kafka
        if in_kafka:
            log.info("output %s: batch %d is in Kafka already (its driver ended before the metadata log "
                     "commit); not producing it again", self.name, batch.batch_id)
        else:
            self._call(self._producer.begin_transaction)
        count = 0
        stored: list[str] = []
        try:
            for key, value in self._changes(batch):
                count += 1
                if self._state is not None:
                    stored.append(value)
                if not in_kafka:
                    self._produce(key, value)
            if stored:
                assert self._snapshots is not None
                self._snapshots.write(self._change_key(batch.batch_id), "".join(stored).encode())
            if not in_kafka:
                self._commit_transaction(batch.batch_id)
        except BaseException:
            self.aborted()
            raise
        return OutputHead(batch.batch_id, self._head.rows + count, self._head.snapshot)

    def _changes(self, batch: Batch) -> Iterator[tuple[bytes | None, str]]:
        """(message key, changelog line) of each change, in order."""
        if self._state is not None:
            for state, chunk in self._keyed_chunks(batch):
                for key, value in keyed_changes(state, chunk, batch.time_ms):
                    yield key.encode(), value
        elif self._message_key:
            for chunk, _ in chunks(batch.df, batch.time_ms, "append-keyed", self._message_key):
                for entry in chunk.decode().splitlines(keepends=True):
                    key, value = entry.split("\t", 1)
                    yield key.encode(), value
        else:
            for chunk, _ in chunks(batch.df, batch.time_ms, "append"):
                for value in chunk.decode().splitlines(keepends=True):
                    yield None, value

    def _produce(self, key: bytes | None, value: str) -> None:
        payload = value.rstrip("\n").encode()
        while True:
            try:
                self._producer.produce(self.topic, value=payload, key=key, on_delivery=self._delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(0.05)
        self._producer.poll(0)

    def _delivered(self, error: Any, _: Any) -> None:
        if error is not None:
            self._failure = self._failure or error

    def _commit_transaction(self, batch_id: int) -> None:
        from confluent_kafka import TopicPartition

        remaining = self._producer.flush(CLIENT_TIMEOUT_S * 4)
        if remaining or self._failure is not None:
            failure, self._failure = self._failure, None
            raise KafkaWriteFailed(f"output {self.name}: {remaining} messages to {self.topic} not acknowledged"
                                   if remaining else f"output {self.name}: a message to {self.topic} failed: {failure}")
        self._call(self._producer.send_offsets_to_transaction,
                   [TopicPartition(self.topic, MARKER_PARTITION, batch_id + 1)],
                   self._marker_consumer.consumer_group_metadata(), CLIENT_TIMEOUT_S)
        crash_point(IN_KAFKA_TRANSACTION, batch_id)
        self._call(self._producer.commit_transaction, CLIENT_TIMEOUT_S * 4)
        self._in_kafka = batch_id
        crash_point(AFTER_KAFKA_COMMIT, batch_id)

    def _call(self, method: Any, *args: Any) -> Any:
        """A producer call, its errors in our words: fenced, or a failure to retry."""
        from confluent_kafka import KafkaError, KafkaException

        try:
            return method(*args)
        except KafkaException as error:
            kafka_error = error.args[0] if error.args else None
            code = kafka_error.code() if isinstance(kafka_error, KafkaError) else None
            if code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
                raise Fenced(f"output {self.name}: a newer driver took over transactional id "
                             f"{self.transactional_id} (Kafka fenced this one)") from None
            raise KafkaWriteFailed(f"output {self.name}: Kafka said: {kafka_error}") from None

    def committed(self, head: OutputHead) -> None:
        self._head = head
        if (state := self._state_ready()) is not None:
            state.commit()

    def aborted(self) -> None:
        if (state := self._state_ready()) is not None:
            state.rollback()
        if self._producer is not None:
            try:
                self._producer.abort_transaction(CLIENT_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - nothing open, or fenced: the broker ends it either way
                pass

    # ---- snapshots of the keyed state ----------------------------------------------------

    def snapshot_committed(self, previous: OutputHead, snapshots: Storage) -> None:
        super().snapshot_committed(previous, snapshots)
        covered = self._head.snapshot.batch if self._head.snapshot else -1
        for batch_id, key in self._change_files(snapshots):
            if batch_id <= covered:
                snapshots.delete(key)

    def _change_key(self, batch_id: int) -> str:
        return join("outputs", self.name, "changes", f"{batch_id:012d}.jsonl")

    def _change_files(self, snapshots: Storage) -> list[tuple[int, str]]:
        prefix = join("outputs", self.name, "changes") + "/"
        found = []
        for key in snapshots.list(prefix):
            name = key[len(prefix):].removesuffix(".jsonl")
            if name.isdigit():
                found.append((int(name), key))
        return sorted(found)

    def _remove_changes(self, snapshots: Storage, after: int) -> None:
        """Changes of batches no commit holds (a driver died before its commit)."""
        for batch_id, key in self._change_files(snapshots):
            if batch_id > after:
                snapshots.delete(key)

    def close(self) -> None:
        if self._marker_consumer is not None:
            self._marker_consumer.close()
        self._join_restore()
        if self._state is not None:
            self._state.close()


class KafkaWriteFailed(Exception):
    """Kafka refused or lost a batch's messages; the batch is not committed and runs again."""

