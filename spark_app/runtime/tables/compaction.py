"""A published table's compaction, in a thread of the publisher's driver, off the batches'
path: every ``every_batches`` committed batches, and every ``every_s`` seconds whatever
happens (readers that advance while the publisher idles free history too).

One round:

1. OPTIMIZE (Delta merges the small files MERGEs leave, those under
   ``merge_below_bytes``; a version that changes no data, which changelog readers skip),
   when the latest version has two such files or more. It holds the table's lock: a MERGE
   waits for it, since the two would conflict.
2. The holds are read; a hold behind for longer than the table's maximum hold age is
   broken (a marker its reader cannot remove, spark_app.state.tables).
3. The frontier (spark_app.state.compaction) is recorded in ``_compaction/frontier.json``
   before anything goes, so that a reader that needs an older version finds out that it
   is gone instead of failing on a missing file.
4. The data files no version from the frontier on needs, and the log's files below the
   newest checkpoint at or below it, are deleted.

Delta's VACUUM is not used: it keeps what the newest version needs plus whatever is
younger than a retention period, rounded to whole hours (VacuumCommand rounds
``retentionHours``), where a hold names a version; a sweep by version keeps exactly what
the holds need. Its deletions are the sweep's, so VACUUM's retention check does not apply.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from pyspark.sql import SparkSession

from spark_app import contract
from spark_app.faults import IN_TABLE_COMPACTION, crash_point
from spark_app.state import compaction as plan
from spark_app.state.delta_log import TableLog, after
from spark_app.state.tables import Broken, Frontier, Hold, HoldRegistry
from spark_app.storage import FileEntry, NotFound, Storage, StorageError

log = logging.getLogger("spark_app")


_REPLAY_COMMITS = 100
"""At most this many commits read to carry a snapshot's files forward (one storage read
each); further than that, Delta reads the snapshot from its newest checkpoint."""


@dataclass(frozen=True)
class CompactionSettings:
    every_batches: int = 10
    """Compact after this many committed batches."""
    every_s: float = 60.0
    """And at least this often."""
    margin_s: float = 60.0
    """Versions committed this recently, and files written this recently, are kept whatever
    the holds say: a new reader has this long to write its hold after it read the latest
    version, and a write in flight is never taken for garbage."""
    max_hold_age_s: float | None = None
    """A hold behind for longer than this is broken (None: never)."""
    merge_below_bytes: int = 64 * 2**20
    """OPTIMIZE merges the data files smaller than this and leaves larger ones alone.
    Delta's own threshold is 1 GiB, so a table below that was rewritten whole at every
    round once it had two files: each round's cost grew with the table, not with what the
    batches since had added."""


@dataclass(frozen=True)
class Round:
    """What one compaction round found and did."""

    latest: int
    frontier: int
    bytes: int
    holders: tuple[contract.HolderReport, ...]
    deleted_files: int
    deleted_log_files: int
    seconds: float
    lock_wait_seconds: float
    """Of ``seconds``, the wait for a batch's MERGE to release the table's lock."""
    optimize_seconds: float
    """Of ``seconds``, OPTIMIZE's (it holds the table's lock, so MERGEs wait for it), or,
    when it did not run, finding that it had nothing to merge."""
    optimized: bool
    """Whether OPTIMIZE ran: not when the latest version had under two files to merge."""
    at_ms: int


class Compactor:
    def __init__(self, name: str, uri: str, storage: Storage, registry: HoldRegistry, lock: threading.Lock,
                 spark: SparkSession, settings: CompactionSettings) -> None:
        self.name = name
        self._uri = uri
        self._storage = storage
        self._registry = registry
        self._lock = lock
        # A session of its own: Delta reads a MERGE's transaction id from the session's
        # configuration, which the publisher's batches set.
        self._spark = spark.newSession()
        self._spark.conf.set("spark.databricks.delta.optimize.minFileSize", str(settings.merge_below_bytes))
        self._settings = settings
        self._log = TableLog(storage)
        self._frontier_files: tuple[int, frozenset[str]] | None = None
        """The last round's frontier and the data files of its snapshot."""
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._batches = 0
        self._last: Round | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"spark_app-compaction-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def batch_committed(self) -> None:
        self._batches += 1
        if self._batches >= self._settings.every_batches:
            self._batches = 0
            self._wake.set()

    def report(self) -> contract.TableReport:
        last = self._last
        if last is None:
            return contract.TableReport()
        return contract.TableReport(version=last.latest, bytes=last.bytes, frontier=last.frontier,
                                    compacted_ms=last.at_ms, holders=last.holders)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self._settings.every_s)
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                self.compact()
            except StorageError as error:
                log.warning("table %s: compaction skipped (%s); it runs again later", self.name, error)
            except Exception:  # noqa: BLE001 - compaction is housekeeping: a failed round must not stop the driver
                log.exception("table %s: compaction failed; it runs again later", self.name)

    def compact(self) -> Round:
        started = time.monotonic()
        with self._lock:
            locked = time.monotonic()
            keys, latest, entries = self._listing()
            mergeable = self._mergeable(latest, entries)
            ran = mergeable is None or mergeable >= 2
            if ran:
                self._optimize()
        optimized = time.monotonic()
        if ran:  # a new version and its file: the log and the folder as they are now
            keys, latest, entries = self._listing()
        now_ms = int(time.time() * 1000)
        margin_ms = int(self._settings.margin_s * 1000)
        holds = self._registry.holds()
        ages = [plan.hold_age(h, latest, self._log.timestamp_ms, now_ms) for h in holds]
        max_age_ms = None if self._settings.max_hold_age_s is None else int(self._settings.max_hold_age_s * 1000)
        for stale in plan.stale(ages, max_age_ms):
            self._break(stale, now_ms)
        broken = {h.reader for h in holds if self._is_broken(h)}
        live = [h for h in holds if h.reader not in broken]
        margin_version = plan.latest_before(latest, self._log.timestamp_ms, now_ms - margin_ms)
        recorded = self._registry.frontier()
        frontier = plan.frontier(live, latest, margin_version, 0 if recorded is None else recorded.version)
        self._registry.set_frontier(Frontier(frontier, latest, now_ms))
        needed = plan.needed_files(self._snapshot_files(frontier),
                                   (self._log.commit(v) for v in range(frontier, latest + 1)))
        doomed = plan.doomed_data_files(entries, needed, now_ms, margin_ms)
        doomed_log = plan.doomed_log_keys(keys, self._log.checkpoints(keys), frontier)
        for number, path in enumerate([*doomed, *doomed_log]):
            if number == (len(doomed) + len(doomed_log)) // 2:
                crash_point(IN_TABLE_COMPACTION)
            self._storage.delete(path)
        self._log.forget(frontier)
        gone = set(doomed) | set(doomed_log)
        blocking = {a.hold.reader for a in plan.blocking([a for a in ages if a.hold.reader not in broken],
                                                          frontier, latest)}
        holders = tuple(
            contract.HolderReport(reader=str(a.hold.reader), kind=a.hold.kind, version=a.hold.version,
                                  behind=a.behind, age_s=None if a.age_ms is None else a.age_ms / 1000,
                                  broken=a.hold.reader in broken, blocking=a.hold.reader in blocking)
            for a in sorted(ages, key=lambda a: str(a.hold.reader)))
        result = Round(latest=latest, frontier=frontier, bytes=sum(e.size for e in entries if e.path not in gone),
                       holders=holders, deleted_files=len(doomed), deleted_log_files=len(doomed_log),
                       seconds=round(time.monotonic() - started, 3), lock_wait_seconds=round(locked - started, 3),
                       optimize_seconds=round(optimized - locked, 3), optimized=ran, at_ms=now_ms)
        self._last = result
        optimize = f"OPTIMIZE {result.optimize_seconds:.1f}s" if ran else "nothing to OPTIMIZE"
        log.info("table %s: compacted in %.1fs (%.1fs waiting for a MERGE, %s): latest version %d, "
                 "frontier %d, %d holds, %d files and %d log files deleted, %d bytes kept",
                 self.name, result.seconds, result.lock_wait_seconds, optimize,
                 latest, frontier, len(holds), len(doomed), len(doomed_log), result.bytes)
        return result

    def _listing(self) -> tuple[list[str], int, list[FileEntry]]:
        """The log's keys, its latest version and the table folder's files, as they are now."""
        keys = self._log.keys()
        return keys, self._log.versions(keys)[-1], self._storage.list_entries("")

    def _mergeable(self, latest: int, entries: list[FileEntry]) -> int | None:
        """How many of the ``latest`` version's files, carried from the last round's
        frontier, OPTIMIZE would merge; None if a round cannot tell (a commit gone, or more
        than _REPLAY_COMMITS to read), and then it runs OPTIMIZE. Under two, Delta would merge
        nothing, after rebuilding the snapshot with Spark jobs (0.3 to 25 s a round in the
        tests' publishers, while their batches waited on the lock), so the round skips it."""
        start, files = self._frontier_files or (-1, frozenset[str]())
        carried = self._carried(files, start, latest) if 0 <= latest - start <= _REPLAY_COMMITS else None
        return None if carried is None else plan.mergeable(carried, entries, self._settings.merge_below_bytes)

    def _optimize(self) -> None:
        from delta.tables import DeltaTable

        DeltaTable.forPath(self._spark, self._uri).optimize().executeCompaction()

    def _snapshot_files(self, version: int) -> frozenset[str]:
        """The data files of the table's snapshot at ``version``, relative to the table: the
        last round's frontier's files carried through the commits since (a frontier never
        moves back), else replayed from the first commit, else (a log below a checkpoint
        gone, as in a restarted publisher's first round, or a long replay) Delta's
        snapshot. A Delta read of an old version cost each round 1.3 to 3.4 s (a test's
        publisher, 2 cores)."""
        start, files = self._frontier_files or (-1, frozenset[str]())
        if start > version:
            start, files = -1, frozenset()
        carried = self._carried(files, start, version) if version - start <= _REPLAY_COMMITS else None
        files = carried if carried is not None else self._delta_snapshot_files(version)
        self._frontier_files = (version, files)
        return files

    def _carried(self, files: frozenset[str], start: int, version: int) -> frozenset[str] | None:
        """``files`` of version ``start`` carried to ``version``; None if a commit is gone."""
        try:
            for v in range(start + 1, version + 1):
                files = after(files, self._log.commit(v))
        except NotFound:
            return None
        return files

    def _delta_snapshot_files(self, version: int) -> frozenset[str]:
        files = (self._spark.read.format("delta").option("versionAsOf", version).load(self._uri).inputFiles())
        root = urlparse(self._uri).path.rstrip("/") + "/"
        return frozenset(unquote(urlparse(f).path).removeprefix(root) for f in files)

    def _is_broken(self, hold: Hold) -> bool:
        marker = self._registry.broken(hold.reader)
        return marker is not None and marker.state_id == hold.state_id

    def _break(self, stale: plan.HoldAge, now_ms: int) -> None:
        hold = stale.hold
        age = "unknown" if stale.age_ms is None else f"{stale.age_ms / 1000:.0f}s"
        reason = (f"it held version {hold.version}, {stale.behind} versions behind for {age}, longer than the "
                  f"table's maximum hold age of {self._settings.max_hold_age_s:.0f}s")
        if self._registry.mark_broken(Broken(hold.reader, hold.state_id, hold.version, now_ms, reason)):
            log.warning("table %s: broke the hold of %s: %s", self.name, hold.reader, reason)
