"""What an output is, and how it takes part in a batch's commit.

Each output takes part in the batch commit in three steps. ``write`` makes the batch's
output durable but does not publish it; the driver then appends the commit record with
the output's new head to the metadata log; ``committed`` finally publishes the batch and
releases what was held for it. After a crash, ``recover`` starts from the committed head.
A ``Sink`` is what a query's batches go to: one output, or an operator that feeds several
(spark_app.runtime.iterate).
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import DataFrame

from spark_app import contract
from spark_app.runtime.sinks.changelog import chunks
from spark_app.runtime.sinks.keyed_state import COMPRESSED, OutputState, Snapshotter
from spark_app.state.records import OutputHead, OutputSnapshot, QueryHead
from spark_app.storage import Storage, join

log = logging.getLogger("spark_app")

RESERVED_COLUMNS = ("time", "diff")
"""Columns a changelog output adds to every row."""


@dataclass(frozen=True)
class Batch:
    """One micro-batch as an output sees it."""

    batch_id: int
    time_ms: int
    """The batch's logical time: Spark's batch timestamp, the same when the batch is replayed."""
    df: DataFrame
    changelog: bool = False
    """The rows already carry their ``diff`` (an upstream operator computed the changes)."""


@dataclass(frozen=True)
class Written:
    """What a batch wrote, to be committed: the outputs' new heads and, for an iterate
    operator, its new stored state."""

    outputs: dict[str, OutputHead]
    iterate: dict[str, Any] | None = None


@dataclass(frozen=True)
class OutputContext:
    """What an output needs to know of the driver it runs in."""

    epoch: int
    state_id: str
    """The stored state's identity (stable across drivers)."""
    snapshots: Storage
    fence: Callable[[], None] = lambda: None
    """Raises ``Fenced`` if a newer driver has started: checked before changing a file
    that a newer driver may already own."""


class OutputDamaged(Exception):
    """An output no longer matches its committed position (edited or deleted by hand)."""


def snapshot_key(output: str, batch_id: int, epoch: int) -> str:
    """Where a snapshot of an output's state goes: named by its batch and its driver's
    epoch, so that no two drivers ever write one key; stored compressed (keyed_state)."""
    return join("outputs", output, "snapshots", f"{batch_id:012d}-e{epoch:06d}.sqlite{COMPRESSED}")


class Output(ABC):
    def __init__(self, name: str, path: str, key: Sequence[str] | None) -> None:
        self.name = name
        self.path = path
        self.key = tuple(key) if key is not None else None

    @abstractmethod
    def recover(self, head: OutputHead | None, context: OutputContext) -> None:
        """Aligns the output with its last committed head (None: nothing committed yet)."""

    @abstractmethod
    def write(self, batch: Batch) -> OutputHead:
        """Writes the batch durably and returns the head to commit; publishes nothing."""

    def committed(self, head: OutputHead) -> None:
        """The commit record holding ``head`` is durable: publish the batch."""

    def aborted(self) -> None:
        """The batch will not be committed by this driver."""

    def start_snapshot(self, head: OutputHead, batch_id: int, snapshots: Storage) -> bool:
        """Begins storing a snapshot of the output's state as of ``head`` (just committed),
        in the background; returns False only if one is still under way (it has no state:
        True, nothing to store)."""
        return True

    def finished_snapshot(self, head: OutputHead) -> OutputHead | None:
        """``head`` naming the snapshot stored since the last call, if one is: the caller
        commits it before calling ``snapshot_committed``."""
        return None

    def snapshot_committed(self, previous: OutputHead, snapshots: Storage) -> None:
        """The head naming the new snapshot is committed: what ``previous`` held can go."""

    def wait_for_snapshot(self, timeout_s: float) -> None:
        """Lets a snapshot under way be stored, for at most ``timeout_s``."""

    def table_report(self) -> contract.TableReport | None:
        """A shared table's state, for the driver's report (None: not a shared table)."""
        return None

    def close(self) -> None:
        pass


class KeyedOutput(Output):
    """An output that, given a key, keeps the row it last emitted for each key
    (sinks.keyed_state.OutputState) and stores snapshots of that state in the background."""

    def __init__(self, name: str, path: str, key: Sequence[str] | None) -> None:
        super().__init__(name, path, key)
        self._state = OutputState(self.key) if self.key is not None else None
        self._snapshotter = Snapshotter(name)
        self._epoch = 0
        """The epoch of the driver this output runs in (set by ``recover``)."""
        self._head = OutputHead(position=0, rows=0)
        self._restoring: _Restore | None = None

    def _restore_state(self, rebuild: Callable[[], None]) -> None:
        """Runs ``rebuild`` (the state's snapshot download and changelog replay) beside the
        query's start; the first use of the state waits for it. The state is needed only
        once Spark has started the query and computed the first batch's rows: restoring 16M
        keys (890 MB) from the local S3 server took 12.8 s of a 24 s resume, all before the
        query started."""
        self._join_restore()  # a query restarted in this driver: the previous one first
        self._restoring = _Restore(self.name, rebuild)

    def _state_ready(self) -> OutputState | None:
        """The state, once restored; the restore's error, if it failed (again at every call:
        a half-restored state is never used)."""
        if self._restoring is not None:
            waited = time.monotonic()
            self._restoring.join()
            if self._restoring.error is not None:
                raise self._restoring.error
            log.info("output %s: state restored %.2fs after the driver started it, waited %.2fs for it",
                     self.name, self._restoring.seconds, time.monotonic() - waited)
            self._restoring = None
        return self._state

    def _join_restore(self) -> None:
        """Waits for a restore under way, whatever its outcome (before closing the state)."""
        if self._restoring is not None:
            self._restoring.join()
            self._restoring = None

    def _keyed_chunks(self, batch: Batch) -> Iterator[tuple[OutputState, bytes]]:
        """The batch's ``key<TAB>row`` chunks, each with the state to compare it with, in a
        transaction of the state's. Spark computes the whole batch in the job behind the
        first chunk (only its first partition when a batch past the driver's result limit is
        fetched a partition at a time), and only then is the state waited for, so that a
        restore under way (a snapshot's download, a changelog's replay) goes on beside the
        batch's job instead of before it: at 1M keys, a replay of 1.4M lines took 9.6 s of a
        restart's 22 s, and the job 7 s after it."""
        assert self._state is not None
        encoded = chunks(batch.df, batch.time_ms, "keyed", self.key)
        try:
            first = next(encoded, None)
            state = self._state_ready()
            assert state is not None
            state.begin()
            if first is not None:
                yield state, first[0]
                for chunk, _ in encoded:
                    yield state, chunk
        finally:
            encoded.close()  # its scratch folder goes now, also when the state failed to restore

    def start_snapshot(self, head: OutputHead, batch_id: int, snapshots: Storage) -> bool:
        if self._restoring is not None and self._restoring.is_alive():
            # Put off, not waited for: the driver asks between batches holding the query's
            # batch lock, and the first batch (which Spark computes before it needs the
            # state) would wait on the lock for the whole restore. Asked again later.
            return False
        state = self._state_ready()
        if state is None:
            return True
        snapshot = OutputSnapshot(batch_id, head.position, snapshot_key(self.name, batch_id, self._epoch))
        return self._snapshotter.start(state, snapshots, snapshot)

    def wait_for_snapshot(self, timeout_s: float) -> None:
        self._snapshotter.wait(timeout_s)

    def finished_snapshot(self, head: OutputHead) -> OutputHead | None:
        stored = self._snapshotter.finished()
        if stored is None:
            return None
        self._head = replace(head, snapshot=stored)
        return self._head

    def snapshot_committed(self, previous: OutputHead, snapshots: Storage) -> None:
        old = previous.snapshot
        if old is not None and (self._head.snapshot is None or old.key != self._head.snapshot.key):
            snapshots.delete(old.key)


class _Restore(threading.Thread):
    """A keyed output's state being restored, off the start's path."""

    def __init__(self, name: str, rebuild: Callable[[], None]) -> None:
        super().__init__(name=f"spark_app-restore-{name}", daemon=True)
        self._rebuild = rebuild
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.start()

    def run(self) -> None:
        began = time.monotonic()
        try:
            self._rebuild()
        except BaseException as error:  # noqa: BLE001 - raised where the state is first used
            self.error = error
        self.seconds = time.monotonic() - began


class Sink(ABC):
    """What a query writes its batches to: one output, or an operator that feeds several
    (see spark_app.runtime.iterate). The driver commits what ``write`` returns."""

    kind = "output"
    """What the sink is, for messages."""

    @abstractmethod
    def outputs(self) -> list[Output]:
        """The outputs whose heads this sink's commits carry."""

    @abstractmethod
    def recover(self, head: QueryHead | None, context: OutputContext) -> None:
        """Aligns with the query's last committed head (None: nothing committed yet)."""

    @abstractmethod
    def write(self, batch: Batch) -> Written:
        """Writes a batch durably; publishes nothing until ``committed``."""

    def start(self, batch_time_ms: int) -> Written | None:
        """Work to commit before the first batch, if any (an iterate operator's check of
        its stored fixed point after a restart)."""
        return None

    def committed(self, written: Written) -> None:
        for output in self.outputs():
            if output.name in written.outputs:
                output.committed(written.outputs[output.name])

    def aborted(self) -> None:
        for output in self.outputs():
            output.aborted()

    def close(self) -> None:
        for output in self.outputs():
            output.close()


class SingleSink(Sink):
    """A query that feeds one output directly."""

    def __init__(self, output: Output) -> None:
        self.output = output

    def outputs(self) -> list[Output]:
        return [self.output]

    def recover(self, head: QueryHead | None, context: OutputContext) -> None:
        self.output.recover(head.outputs.get(self.output.name) if head else None, context)

    def write(self, batch: Batch) -> Written:
        return Written({self.output.name: self.output.write(batch)})
