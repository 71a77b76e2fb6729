"""Deterministic crash points for the recovery tests.

``SPARK_APP_FAULT=<point>:<n>`` kills the driver (its whole process group, JVM included,
as a lost node would; or freezes it, with ``SPARK_APP_FAULT_ACTION=stop``) when it reaches ``point``: for a point of a batch, in batch ``n``;
for the others, the ``n``-th time this process reaches it. Random kills rarely land in
the narrow windows that matter most, such as between spark_app's commit and Spark's own
commit-log entry, or inside a compaction; these points make those windows testable.

This module imports nothing of spark_app, so every layer (storage included) may use it.
"""

from __future__ import annotations

import os
import signal
import threading

FAULT = "SPARK_APP_FAULT"
FAULT_ACTION = "SPARK_APP_FAULT_ACTION"
"""``kill`` (the default: SIGKILL) or ``stop`` (SIGSTOP: the driver freezes there, as in a
long pause, until a test sends SIGCONT)."""

# Points of a batch (n is the batch id).
AFTER_OUTPUT = "after-output"
"""The batch's output is staged but not committed."""
AFTER_COMMIT = "after-commit"
"""The batch is committed in the metadata log, but not yet copied into its output, nor
recorded by Spark."""
AFTER_PUBLISH = "after-publish"
"""The batch is committed and copied into its output; Spark has not recorded it."""
AFTER_SNAPSHOT_WRITE = "after-snapshot-write"
"""A new snapshot of an output's state is stored but not committed."""
AFTER_SNAPSHOT_COMMIT = "after-snapshot-commit"
"""A new output snapshot is committed; the previous one is not deleted yet."""
IN_ITERATION = "in-iteration"
"""An iterate operator has finished an iteration of the batch's fixed point, not the last."""
IN_KAFKA_TRANSACTION = "in-kafka-transaction"
"""A Kafka output's batch is sent in its transaction (messages and marker), not committed."""
AFTER_KAFKA_COMMIT = "after-kafka-commit"
"""A Kafka output's transaction is committed; the metadata log does not hold the batch yet."""

# Points counted by occurrence (n: the n-th time).
IN_STORAGE_WRITE = "in-storage-write"
"""Inside a write or put-if-absent of the storage layer: the bytes are durable in a
temporary file (filesystem) or about to be sent (S3), the key is not written."""
IN_LOG_COMPACTION = "in-log-compaction"
"""Halfway through deleting the metadata log's old entries."""
IN_INDEX_COMPACTION = "in-index-compaction"
"""A file index's new base is stored; the segments it replaces are not deleted yet."""
IN_TABLE_COMPACTION = "in-table-compaction"
"""Halfway through deleting what a shared table's compaction found no hold needs (its
frontier is recorded)."""
IN_RECOVERY = "in-recovery"
"""A query's outputs are aligned with the last commit (redo and cut-off done); the query
has not started."""

BATCH_POINTS = (AFTER_OUTPUT, AFTER_COMMIT, AFTER_PUBLISH, AFTER_SNAPSHOT_WRITE, AFTER_SNAPSHOT_COMMIT,
                IN_ITERATION, IN_KAFKA_TRANSACTION, AFTER_KAFKA_COMMIT)
COUNTED_POINTS = (IN_STORAGE_WRITE, IN_LOG_COMPACTION, IN_INDEX_COMPACTION, IN_RECOVERY, IN_TABLE_COMPACTION)

_reached: dict[str, int] = {}
_lock = threading.Lock()


def crash_point(point: str, batch_id: int | None = None) -> None:
    """Kills the process group here if ``SPARK_APP_FAULT`` names this point (and batch)."""
    wanted = os.environ.get(FAULT)
    if not wanted or not wanted.startswith(point + ":"):
        return
    if batch_id is None:
        with _lock:
            _reached[point] = count = _reached.get(point, 0) + 1
    else:
        count = batch_id
    if wanted == f"{point}:{count}":
        if os.environ.get(FAULT_ACTION) == "stop":
            _freeze_group()
        else:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # every thread dies on its way back to user space


def _freeze_group() -> None:
    """SIGSTOP to the process group, this thread stopping before its next step. A SIGSTOP
    sent to the group is taken by one thread of this process (the main one), which then
    stops the others, and this thread ran on meanwhile (into a Kafka commit, in a test of a
    driver frozen before it). So the other processes of the group (the JVM, Python workers)
    get it one by one, and this process through this thread, which then starts the stop."""
    me, group = os.getpid(), os.getpgrp()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                pgrp = int(stat.read().rpartition(")")[2].split()[2])
            if pgrp == group:
                os.kill(int(entry), signal.SIGSTOP)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
