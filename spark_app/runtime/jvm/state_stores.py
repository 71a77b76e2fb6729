"""Storing Spark's state store snapshots before a clean stop.

With changelog checkpointing, Spark's RocksDB state store writes a changelog file per
batch and makes a snapshot of its last version locally; a maintenance thread uploads
that snapshot every maintenance interval (our snapshot interval). A driver that stops
before the next tick leaves only changelog files, and every later start replays all of
them: a deduplication of 4M ids restarted three times replayed 6, then 10, then 14 files
(5.7 to 6.4 s of a 11 s start, bench/resume). So a clean stop, once its queries have
stopped, runs the maintenance of every state store loaded in this JVM and unloads it, as
Spark does for a store that has moved to another executor (StateStore's public
``doMaintenanceAndUnload``).

When a store snapshots is ours to time, too. Spark snapshots a store at the commit of
every ``minDeltasForSnapshot``-th version, and each snapshot flushes RocksDB's memory into
a new file: one file per batch (we had it at 1) makes a batch's commit slower (0.76 against
0.66 s p50 for a 100-row batch) and, for keys that arrive in order (event ids, time
windows), which RocksDB moves down its levels without merging, leaves a file per batch
that every later start copies (1,000 per partition after 1,000 batches). So the count is
Spark's default of 10 (session.py), and once per snapshot interval, when the driver's own
snapshots are due, a query's stores snapshot their last version then and there (private
``createSnapshot``, queued for upload as a commit queues it), after a batch or while the
query is idle, under the query's batch lock, so never while its tasks use the stores.
Snapshotting at the next commit instead left an idle query's last versions to the
changelog: a driver killed then replayed it all (recovery 10.0 s against 8.9 s at 1M
keys). A clean stop does the same for every store before the maintenance uploads.

Spark keeps no public list of the loaded stores: it is read from StateStore's private
``loadedProviders`` by reflection (Spark 4.1.2, pinned). If that ever fails, the stop
goes on and the next start replays the changelog, as before, and snapshots come every
10 versions. Executors in other pods (Kubernetes execution) keep their stores; their
maintenance is theirs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("spark_app")

_STATE_STORE = "org.apache.spark.sql.execution.streaming.state.StateStore$"
_ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDB"
_STATE_MACHINE = "org$apache$spark$sql$execution$streaming$state$RocksDBStateStoreProvider$$stateMachine"
"""The provider's RocksDBStateMachine (public in the bytecode, Scala-private in the source)."""
MIN_DELTAS_FOR_SNAPSHOT = 10
"""Spark's default: a store snapshots at least every 10 versions (session.py)."""


class _Reflection:
    """Spark's private state store members, reached through the JVM's reflection."""

    def __init__(self, spark: Any) -> None:
        self._gateway = spark.sparkContext._gateway
        self.jvm = spark.sparkContext._jvm
        self._module_class = self.jvm.java.lang.Class.forName(_STATE_STORE)
        self.module = self._module_class.getField("MODULE$").get(None)

    def module_member(self, name: str) -> Any:
        return self.call(self._module_class, self.module, name)

    def call(self, cls: Any, target: Any, name: str, *args: tuple[Any, Any]) -> Any:
        """``target.name(*values)`` for a private method; ``args`` are (class, value) pairs."""
        types = self._gateway.new_array(self.jvm.java.lang.Class, len(args))
        values = self._gateway.new_array(self.jvm.java.lang.Object, len(args))
        for i, (arg_class, value) in enumerate(args):
            types[i], values[i] = arg_class, value
        method = cls.getDeclaredMethod(name, types)
        method.setAccessible(True)
        return method.invoke(target, values)

    def field(self, cls: Any, name: str) -> Any:
        field = cls.getDeclaredField(name)
        field.setAccessible(True)
        return field

    def rocksdbs(self, checkpoint: str | None = None) -> list[tuple[Any, Any]]:
        """The RocksDB instances of the stores loaded in this JVM, or of those under the
        ``checkpoint`` folder only (a query's), each with its provider's state machine.
        Taken from a copy of the map, which Spark's tasks change as they load stores."""
        entries = self.module_member("loadedProviders").clone().iterator()
        provider_class = self.jvm.java.lang.Class.forName(_ROCKSDB_PROVIDER)
        rocksdb = self.field(provider_class, "rocksDB")
        machine = provider_class.getMethod(_STATE_MACHINE, self._gateway.new_array(self.jvm.java.lang.Class, 0))
        found = []
        while entries.hasNext():
            entry = entries.next()
            provider = entry._2()
            if checkpoint is not None and not _under(entry._1().storeId().checkpointRootLocation(), checkpoint):
                continue
            if provider_class.isInstance(provider):
                db = rocksdb.get(provider)
                if db is not None:
                    found.append((db, machine.invoke(provider, self._gateway.new_array(self.jvm.java.lang.Object, 0))))
        return found


def _under(location: str, checkpoint: str) -> bool:
    """A store's checkpoint location ("file:/x/checkpoints/q/state") is in ``checkpoint``
    ("checkpoints/q"), whatever form of the scheme each has."""
    return location.rstrip("/").endswith("/" + checkpoint.strip("/") + "/state")


def snapshot_now(spark: Any, checkpoint: str) -> int:
    """Snapshots the last version of each RocksDB state store of the query whose checkpoint
    is ``checkpoint`` (``checkpoints/<query>``) that has none yet; Spark's maintenance
    uploads it. Call it only while none of the query's tasks runs (its batch lock). Returns
    how many it snapshotted; failing, it logs and leaves Spark's count of versions to decide."""
    try:
        return _snapshot_last_versions(_Reflection(spark), checkpoint)
    except Exception as error:  # noqa: BLE001 - snapshots then come every minDeltasForSnapshot versions
        log.debug("could not snapshot the state stores of %s: %s", checkpoint, error)
        return 0


def store_snapshots(spark: Any, settle_s: float = 10.0) -> int:
    """Snapshots the last version of every state store loaded in this JVM, uploads it and
    unloads the store; returns how many stores there were. Call it only once the queries
    have stopped."""
    try:
        reflection = _Reflection(spark)
        module = reflection.module
        # Spark's maintenance thread could be uploading from a store being unloaded here
        # (seen: NoSuchFileException on a removed checkpoint folder): it is paused, and what
        # it has under way finishes first. (Stopping it instead waited out its 300 s
        # shutdown timeout: its pool did not end.)
        module.setMaintenancePaused(True)
        under_way = reflection.module_member("maintenancePartitions")
        deadline = time.monotonic() + settle_s
        while not under_way.isEmpty() and time.monotonic() < deadline:
            time.sleep(0.05)
        ids = []
        keys = reflection.module_member("loadedProviders").keysIterator()
        while keys.hasNext():
            ids.append(keys.next())
        snapshotted = _snapshot_last_versions(reflection)
    except Exception as error:  # noqa: BLE001 - the next start replays the changelog instead
        log.warning("could not list Spark's state stores to store their snapshots before stopping: %s", error)
        return 0
    log.debug("snapshotted the last version of %d state stores", snapshotted)
    for provider in ids:
        try:
            module.doMaintenanceAndUnload(provider)
        except Exception as error:  # noqa: BLE001 - one store's failure leaves its changelog to replay
            log.warning("could not store the snapshot of state store %s: %s", provider.toString(), error)
    return len(ids)


def _snapshot_last_versions(reflection: _Reflection, checkpoint: str | None = None) -> int:
    """Queues a snapshot of its loaded version for each store (of the query whose checkpoint
    is ``checkpoint``, or every one) whose last snapshot is older, as its commit would have
    (RocksDB.createSnapshot, then the upload queue that Spark's maintenance empties)."""
    jvm = reflection.jvm
    rocksdb_class = jvm.java.lang.Class.forName(_ROCKSDB)
    option_class = jvm.java.lang.Class.forName("scala.Option")
    last_snapshot = reflection.field(rocksdb_class, "lastSnapshotVersion")
    queued = 0
    for db, machine in reflection.rocksdbs(checkpoint):
        # The store is taken as a task takes it (its state machine's stamp, held from load
        # to commit), so that no task loads it and no unload closes it meanwhile: a native
        # checkpoint of a database being closed crashed the JVM (SIGSEGV in RocksDB's
        # CreateCheckpoint, once in a make test). A closed store refuses the stamp.
        try:
            stamp = machine.acquireStamp()
        except Exception as error:  # noqa: BLE001 - closed, or a task holds it past the wait: its commit snapshots
            log.debug("not snapshotting a state store Spark holds or has closed: %s", error)
            continue
        try:
            version = db.loadedVersion()
            if version <= 0 or last_snapshot.getLong(db) >= version:
                continue
            created = reflection.call(rocksdb_class, db, "createSnapshot", (jvm.java.lang.Long.TYPE, jvm.java.lang.Long.valueOf(version)),
                                      (option_class, db.sessionStateStoreCkptId()))
            snapshot = created._1()
            if snapshot.isDefined():
                reflection.call(rocksdb_class, db, "snapshotsToUploadQueue").offer(snapshot.get())
                last_snapshot.setLong(db, version)
                queued += 1
        except Exception as error:  # noqa: BLE001 - this store's next start replays its changelog
            log.warning("could not snapshot the last version of a state store: %s", error)
        finally:
            machine.releaseStamp(stamp, False)
    return queued
