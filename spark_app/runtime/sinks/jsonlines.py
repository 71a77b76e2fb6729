"""A changelog in a JSON-lines file, written so that every batch lands exactly once.

A JSON-lines output stages each batch in a file of its own beside the output
(``.<name>.pending/e<epoch>-b<batch>.jsonl``) and copies it into the output only once
the commit holds it, at the committed offset. So a driver that has been superseded
(frozen, partitioned) and is still running writes nothing the newer one reads: its
commit fails before anything is published. A driver that dies between its commit and
the copy leaves the staged file named in the head, and the next driver finishes the
copy. The copy writes the same bytes at the same offset whoever does it, and never cuts
the output short.

Every change to the output file (the copy, and recovery's cut-off of bytes no commit
names) is made holding an exclusive lock on it (``flock``, which NFS implements too) and
after checking, under that lock, that no newer driver has started: a superseded driver
thawed in the middle of its own start-up finds the newer epoch and changes nothing, and
one that checked before it was frozen changes the file before the newer driver first
does. (A driver frozen while it holds the lock delays the newer one's copies, never its
commits; the lock goes with the process.)

Rows are encoded in Spark's tasks and reach the driver a partition at a time, so a
large batch is never held whole in the driver's memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Callable, Iterator, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_app.faults import AFTER_PUBLISH, crash_point
from spark_app.runtime.sinks.base import Batch, KeyedOutput, OutputContext, OutputDamaged
from spark_app.runtime.sinks.changelog import chunks, keyed_changes
from spark_app.runtime.sinks.keyed_state import OutputState
from spark_app.state.records import OutputHead, StagedBatch
from spark_app.storage import NotFound, Storage

log = logging.getLogger("spark_app")

class JsonLinesOutput(KeyedOutput):
    """A changelog of the query's result in one JSON-lines file: each row's columns plus
    ``time`` and ``diff``. In update mode an updated key gives a -1 line for the row last
    emitted and a +1 line for the new one; a row that did not change gives nothing."""

    def __init__(self, name: str, path: str, key: Sequence[str] | None, changes: bool = False) -> None:
        super().__init__(name, os.path.abspath(path), key)
        self._carries_diff = changes
        """The query's rows carry their own ``diff`` (a shared table's changelog): written as
        they are, consolidated per batch."""
        folder, file = os.path.split(self.path)
        self._pending = os.path.join(folder, f".{file}.pending")
        self._fence: Callable[[], None] = lambda: None

    def recover(self, head: OutputHead | None, context: OutputContext) -> None:
        self._head = head or OutputHead(position=0, rows=0)
        self._epoch, self._fence = context.epoch, context.fence
        os.makedirs(self._pending, exist_ok=True)
        with self._exclusive():
            open(self.path, "ab").close()  # readers find the (empty) output from the first start on
            size = os.path.getsize(self.path)
            if size > self._head.position:
                # Nothing but a hand (or an older spark_app, which wrote before it committed)
                # writes past the committed head: a newer driver was ruled out under the lock.
                verb = "overwriting" if head is None else "cutting off"
                log.info("output %s: %s %d bytes written after the last commit", self.path, verb,
                         size - self._head.position)
                with open(self.path, "ab") as handle:
                    handle.truncate(self._head.position)
                    os.fsync(handle.fileno())
            elif size < self._head.position:
                log.info("output %s: copying in bytes %d to %d of the last batch, committed by the last driver",
                         self.path, size, self._head.position)
                self._copy_staged(self._head)
            self._remove_staged(keep=None)
        if self._state is not None:
            snapshots = context.snapshots
            self._restore_state(lambda: self._rebuild_state(snapshots))

    def _rebuild_state(self, snapshots: Storage) -> None:
        assert self._state is not None
        start = 0
        snap = self._head.snapshot
        if snap is not None:
            try:
                self._state.restore_from(snapshots, snap.key)
                start = snap.position
            except NotFound:
                log.warning("output %s: snapshot %s is missing; replaying the whole changelog", self.name, snap.key)
        replayed = self._state.apply_changelog(_lines(self.path, start, self._head.position))
        log.info("output %s: state of %d keys restored (snapshot at byte %d, %d changelog lines replayed)",
                 self.name, len(self._state), start, replayed)

    def write(self, batch: Batch) -> OutputHead:
        name = f"e{self._epoch:06d}-b{batch.batch_id:012d}.jsonl"
        staged = os.path.join(self._pending, name)
        size = lines = 0
        try:
            with open(staged, "wb") as handle:
                for chunk, count in self._encoded(batch):
                    handle.write(chunk)
                    size += len(chunk)
                    lines += count
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            self.aborted()
            raise
        start = self._head.position
        return OutputHead(start + size, self._head.rows + lines, self._head.snapshot, StagedBatch(name, start))

    def _encoded(self, batch: Batch) -> Iterator[tuple[bytes, int]]:
        """The batch's changelog lines, a chunk at a time, each with its line count."""
        if batch.changelog or self._carries_diff:
            # Retractions first, so that within a batch a row is removed before its update lands.
            rows = (_consolidated(batch.df) if self._carries_diff else batch.df).persist()
            try:
                for sign in (-1, 1):
                    part = rows.where(F.col("diff") < 0) if sign < 0 else rows.where(F.col("diff") > 0)
                    yield from chunks(part, batch.time_ms, "changelog")
            finally:
                rows.unpersist()
        elif self._state is not None:
            for state, chunk in self._keyed_chunks(batch):
                yield self._changes(state, chunk, batch.time_ms)
        else:
            yield from chunks(batch.df, batch.time_ms, "append")

    @staticmethod
    def _changes(state: OutputState, chunk: bytes, time_ms: int) -> tuple[bytes, int]:
        """The changelog lines of a chunk of keyed rows, against the rows last emitted."""
        lines = [line for _, line in keyed_changes(state, chunk, time_ms)]
        return "".join(lines).encode(), len(lines)

    def committed(self, head: OutputHead) -> None:
        with self._exclusive():
            self._copy_staged(head)
        crash_point(AFTER_PUBLISH, self._batch_of(head))
        self._head = head
        if (state := self._state_ready()) is not None:
            state.commit()
        self._remove_staged(keep=None)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Holds the output's lock, and checks under it that this driver is still the newest."""
        with open(os.path.join(self._pending, "lock"), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                self._fence()
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _copy_staged(self, head: OutputHead) -> None:
        """Copies the committed batch's staged bytes into the output, at their offset. Safe
        to repeat, and by any driver: the bytes and the offset are the commit's."""
        staged = head.staged
        size = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        if size >= head.position:
            return  # done already (by this driver, or by a newer one that finished it)
        if staged is None or size < staged.start:
            raise OutputDamaged(
                f"output {self.path} holds {size} bytes but {head.position} were committed: it was "
                "truncated or replaced outside spark_app; restore it, or reset the pipeline's state"
            )
        source = os.path.join(self._pending, staged.key)
        try:
            with open(source, "rb") as data, open(self.path, "r+b" if os.path.exists(self.path) else "wb") as out:
                data.seek(size - staged.start)
                out.seek(size)
                while block := data.read(1 << 20):
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
        except FileNotFoundError:
            if os.path.exists(self.path) and os.path.getsize(self.path) >= head.position:
                return  # another driver finished the copy and removed the staged file
            raise OutputDamaged(
                f"output {self.path} lacks bytes {size} to {head.position} of its last committed batch, and "
                f"the staged copy {source} is gone; restore the output, or reset the pipeline's state"
            ) from None

    @staticmethod
    def _batch_of(head: OutputHead) -> int | None:
        """The batch a head's staged file holds (its name says so)."""
        if head.staged is None:
            return None
        return int(head.staged.key.rsplit("-b", 1)[1].split(".", 1)[0])

    def _remove_staged(self, keep: str | None) -> None:
        """Staged files are no longer needed once their batch is in the output (or was
        never committed)."""
        try:
            names = os.listdir(self._pending)
        except FileNotFoundError:
            return
        for name in names:
            if name not in (keep, "lock"):
                try:
                    os.unlink(os.path.join(self._pending, name))
                except FileNotFoundError:
                    pass

    def aborted(self) -> None:
        if (state := self._state_ready()) is not None:
            state.rollback()

    def close(self) -> None:
        self._join_restore()
        if self._state is not None:
            self._state.close()


def _consolidated(df: DataFrame) -> DataFrame:
    """One line per distinct row and its net diff, none for a row that comes and goes
    within the batch: a batch that spans several versions of a table may update a key
    twice (-a +b, -b +c), which retractions-first order could not replay; consolidated,
    it is -a +c."""
    columns = [c for c in df.columns if c != "diff"]
    return (df.groupBy(*columns).agg(F.sum("diff").cast("int").alias("diff")).where(F.col("diff") != 0)
            .select(*df.columns))


def _lines(path: str, start: int, end: int) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        handle.seek(start)
        remaining = end - start
        for line in handle:
            if remaining <= 0:
                break
            remaining -= len(line)
            yield line


