"""A driver's hold on a pipeline's state: its epoch, its lease, and the commits it appends.

Single writer, in two parts:

* Fencing, for correctness. Each driver runs under an epoch. It appends an ``epoch``
  record to the metadata log when it starts, and every commit goes to the entry right
  after the last one it wrote. A driver that finds that entry already taken has been
  superseded, and stops without committing (``Fenced``). So once epoch N has started,
  no driver with a lower epoch can commit, whatever it believes.
* The lease, for fast failure. The running driver renews ``lease.json`` every few
  seconds. A local run (no epoch from the operator) refuses to start while a live
  driver holds the lease. The operator passes an explicit, higher epoch after it has
  confirmed that the previous driver pod is gone, so it does not wait for the lease
  to expire.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from spark_app.contract import STALE_EPOCH_PREFIX
from spark_app.state.identity import IncompatibleChange, Manifest, compare
from spark_app.state.log import LogConflict, LogEntry, MetadataLog
from spark_app.state.records import QueryHead, heads_from_record, heads_to_json
from spark_app.storage import NotFound, Storage, join

log = logging.getLogger("spark_app.state")

LEASE_KEY = "lease.json"
MANIFESTS = "manifests/"
LOG_RETAINED = 100


class AlreadyRunning(Exception):
    """A live driver holds this pipeline's state."""


class StaleEpoch(Exception):
    """The requested epoch is not above the newest epoch that already started."""


class StateOwnedElsewhere(Exception):
    """The state root belongs to another PersistentPipeline."""


class LeaseDamaged(Exception):
    """lease.json is not a lease (truncated, or written by something else)."""


class Fenced(Exception):
    """A driver with a higher epoch has started; this one must stop without committing."""


@dataclass(frozen=True)
class Holder:
    """Who runs a driver, for the lease and for messages."""

    pipeline: str
    host: str
    pid: int
    writer: str
    boot: str = ""
    """The kernel's boot id: with the host name, it tells this machine from another one of
    the same name (pods of one name on two nodes), and this boot from the last."""
    started: str = ""
    """The process's start time in clock ticks since boot: a pid reused by a later process
    has another one."""

    @classmethod
    def this_process(cls, pipeline: str) -> Holder:
        pid = os.getpid()
        return cls(pipeline=pipeline, host=socket.gethostname(), pid=pid, writer=uuid.uuid4().hex,
                   boot=_boot_id(), started=_start_time(pid))

    def describe(self) -> str:
        name = f"pipeline {self.pipeline}, " if self.pipeline else ""
        return f"{name}pid {self.pid} on host {self.host}"

    def is_gone(self) -> bool:
        """Whether this holder's process is known to have ended: it ran on this machine in
        this boot, and its pid is free or belongs to a process started at another time.
        Unknown (another host, no /proc) counts as not gone."""
        if not self.boot or self.host != socket.gethostname() or self.boot != _boot_id():
            return False
        if not pid_exists(self.pid):
            return True
        return bool(self.started) and _start_time(self.pid) != self.started


def pid_exists(pid: int) -> bool:
    """Whether a process of this pid runs on this machine (under any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    return True


@dataclass(frozen=True)
class Lease:
    epoch: int
    holder: Holder
    renewed_ms: int
    ttl_ms: int
    released: bool = False
    status: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Lease:
        return cls(
            epoch=int(value["epoch"]),
            holder=Holder(**value["holder"]),
            renewed_ms=int(value["renewed_ms"]),
            ttl_ms=int(value["ttl_ms"]),
            released=bool(value.get("released", False)),
            status=value.get("status"),
        )

    def is_live(self, now_ms: int) -> bool:
        return not self.released and now_ms - self.renewed_ms < self.ttl_ms


def read_lease(storage: Storage) -> Lease | None:
    try:
        data = storage.read(LEASE_KEY)
    except NotFound:
        return None
    try:
        return Lease.from_json(json.loads(data))
    except (ValueError, KeyError, TypeError) as error:
        raise LeaseDamaged(f"{storage.root_uri}/{LEASE_KEY} is damaged ({len(data)} bytes; {error}); "
                           "`python -m spark_app repair URI` removes it (the metadata log, not the "
                           "lease, decides which driver may commit)") from None


def _read_lease_or_none(storage: Storage) -> Lease | None:
    """The lease, where a damaged one only warns: it is advisory, the log fences."""
    try:
        return read_lease(storage)
    except LeaseDamaged as damaged:
        log.warning("ignoring the lease: %s", damaged)
        return None


def read_manifest(storage: Storage, digest: str | None) -> Manifest | None:
    if not digest:
        return None
    try:
        return Manifest.from_json(json.loads(storage.read(join(MANIFESTS, f"{digest}.json"))))
    except NotFound:
        return None


class StateSession:
    """Opened once per driver run with ``StateSession.open``; not shared between processes.

    The queries of one driver share it from their own threads: appends and fence checks
    take turns, so that one query's append in progress never looks to another like a
    newer driver's entry."""

    def __init__(self, storage: Storage, holder: Holder, epoch: int, entry: LogEntry,
                 lease_ttl_ms: int, clock: Callable[[], float], previous_epoch: int = 0,
                 log_retained: int = 0) -> None:
        self._storage = storage
        self._log = MetadataLog(storage)
        self.holder = holder
        self.epoch = epoch
        self.previous_epoch = previous_epoch
        """The newest epoch stored before this driver started (0 for new state)."""
        self._seq = entry.seq
        self._manifest = entry.record.get("manifest")
        self.state_id: str = entry.record["state_id"]
        self.owner: str = entry.record.get("owner") or ""
        self.heads: dict[str, QueryHead] = heads_from_record(entry.record)
        self._lease_ttl_ms = lease_ttl_ms
        self._clock = clock
        self._appends = 0
        self._log_retained = log_retained or LOG_RETAINED
        self._turn = threading.Lock()

    @classmethod
    def open(
        cls,
        storage: Storage,
        manifest: Manifest,
        *,
        holder: Holder,
        requested_epoch: int | None = None,
        owner: str = "",
        log_retained: int = 0,
        lease_ttl_ms: int = 30_000,
        clock: Callable[[], float] = time.time,
    ) -> StateSession:
        """Takes the next epoch of the pipeline whose metadata lives in ``storage``.

        ``owner`` names the PersistentPipeline (namespace/name) the driver runs for; empty
        for a local run, which may resume any state. Raises ``AlreadyRunning``,
        ``StaleEpoch``, ``StateOwnedElsewhere`` or ``IncompatibleChange`` with a message
        the user can act on. Nothing is written unless all checks pass.
        """
        storage.check_writable()
        metadata_log = MetadataLog(storage)
        for _ in range(3):
            latest = metadata_log.latest()
            stored_owner = (latest.record.get("owner") or "") if latest else ""
            if owner and stored_owner and owner != stored_owner:
                raise StateOwnedElsewhere(
                    f"the state at {storage.root_uri} belongs to PersistentPipeline {stored_owner}, not {owner}: "
                    "two pipelines must not share a state root (they would fence each other, and deleting one "
                    "could delete the other's state); give this one a persistence path of its own")
            stored_epoch = int(latest.record["epoch"]) if latest else 0
            epoch = _choose_epoch(storage, stored_epoch, requested_epoch, int(clock() * 1000))
            heads = heads_from_record(latest.record) if latest else {}
            stored = read_manifest(storage, latest.record.get("manifest")) if latest else None
            if stored is not None:
                changes = compare(stored, manifest, set(heads))
                for change in changes:
                    if change.compatible:
                        log.info("state kept across a code change: %s", change.message)
                if any(not c.compatible for c in changes):
                    raise IncompatibleChange(changes, storage.root_uri)
            digest = manifest.digest()
            if stored is None or latest is None or latest.record.get("manifest") != digest:
                # Stored under its digest: unchanged code read it back just now.
                storage.create(join(MANIFESTS, f"{digest}.json"),
                               json.dumps(manifest.to_json(), sort_keys=True).encode())
            state_id = latest.record.get("state_id") if latest else None
            record = _record("epoch", epoch, holder, clock, digest, heads,
                             {"host": holder.host, "pid": holder.pid, "pipeline": holder.pipeline},
                             state_id or uuid.uuid4().hex, owner or stored_owner)
            try:
                entry = metadata_log.append((latest.seq if latest else 0) + 1, record)
            except LogConflict:
                continue  # someone appended meanwhile: look again, the checks may now refuse
            session = cls(storage, holder, epoch, entry, lease_ttl_ms, clock, stored_epoch, log_retained)
            session.renew_lease(status={"starting": True})
            if latest:
                log.info("resuming %s at epoch %d from metadata log entry %d (%s)", storage.root_uri,
                         epoch, latest.seq, _describe_heads(heads))
            else:
                log.info("starting %s at epoch %d with empty state", storage.root_uri, epoch)
            return session
        raise AlreadyRunning(f"another driver keeps writing the metadata log at {storage.root_uri}; "
                             "only one driver may run a pipeline's state at a time")

    def commit(self, query: str, head: QueryHead, kind: str = "commit") -> LogEntry:
        """Appends ``head`` as the query's new head in the next log entry; raises ``Fenced``.

        ``kind`` is "commit" for a batch, or e.g. "snapshot" when only a stored snapshot
        reference changed."""
        heads = {**self.heads, query: head}
        entry = self._append(kind, heads, {"query": query, "batch": head.batch})
        self.heads = heads
        return entry

    def record(self, kind: str, detail: dict[str, Any]) -> LogEntry:
        """Appends a non-commit record (e.g. a stored snapshot); raises ``Fenced``."""
        return self._append(kind, self.heads, detail)

    def check_not_fenced(self) -> None:
        """Raises ``Fenced`` if another driver has appended after this one's last entry
        (anywhere above it: compaction may have emptied the slot right after it)."""
        with self._turn:
            newer = self._log.newest_after(self._seq)
        if newer is not None:
            raise self._fenced(newer)

    def renew_lease(self, status: dict[str, Any] | None = None, released: bool = False) -> None:
        current = _read_lease_or_none(self._storage)
        if current is not None and current.epoch > self.epoch:
            raise Fenced(f"driver epoch {self.epoch} was superseded by epoch {current.epoch} "
                         f"({current.holder.describe()}); this driver stops without committing")
        lease = Lease(self.epoch, self.holder, int(self._clock() * 1000), self._lease_ttl_ms, released, status)
        self._storage.write(LEASE_KEY, json.dumps(asdict(lease), sort_keys=True).encode())

    def close(self, reason: str) -> None:
        """Records a clean stop and releases the lease, so the next driver starts at once."""
        try:
            self._append("stop", self.heads, {"reason": reason})
            self.renew_lease(status={"stopped": reason}, released=True)
        except Fenced:
            log.warning("not releasing the lease: a newer driver already holds it")

    def _append(self, kind: str, heads: dict[str, QueryHead], detail: dict[str, Any]) -> LogEntry:
        record = _record(kind, self.epoch, self.holder, self._clock, self._manifest, heads, detail, self.state_id,
                         self.owner)
        with self._turn:
            try:
                entry = self._log.append(self._seq + 1, record)
            except LogConflict as conflict:
                raise self._fenced(conflict.existing) from None
            self._seq = entry.seq
            self._appends += 1
            if self._appends % self._log_retained == 0:
                self._log.compact(self._log_retained)
        return entry

    def _fenced(self, newer: LogEntry) -> Fenced:
        return Fenced(
            f"driver epoch {self.epoch} was superseded: metadata log entry {newer.seq} was written by "
            f"epoch {newer.record.get('epoch', '?')}; this driver stops without committing"
        )


def _choose_epoch(storage: Storage, stored_epoch: int, requested: int | None, now_ms: int) -> int:
    lease = _read_lease_or_none(storage)
    if requested is not None:
        if requested <= stored_epoch:
            raise StaleEpoch(f"{STALE_EPOCH_PREFIX}{stored_epoch}: epoch {requested} is not above it, on "
                             f"{storage.root_uri}; a newer driver took over, so this one must not run")
        if lease is not None and lease.is_live(now_ms):
            log.warning("taking over from epoch %d (%s), whose lease was renewed %.1fs ago", lease.epoch,
                        lease.holder.describe(), (now_ms - lease.renewed_ms) / 1000)
        return requested
    if lease is not None and lease.epoch >= stored_epoch and lease.is_live(now_ms):
        if lease.holder.is_gone():
            log.warning("taking over at once from epoch %d: its lease was renewed %.1fs ago, but its holder "
                        "(%s) has ended", lease.epoch, (now_ms - lease.renewed_ms) / 1000, lease.holder.describe())
            return stored_epoch + 1
        raise AlreadyRunning(
            f"another driver holds the state at {storage.root_uri}: epoch {lease.epoch}, "
            f"{lease.holder.describe()}, lease renewed {(now_ms - lease.renewed_ms) / 1000:.1f}s ago. "
            f"Stop it first, or wait {lease.ttl_ms / 1000:.0f}s if it has died."
        )
    return stored_epoch + 1


def _record(kind: str, epoch: int, holder: Holder, clock: Callable[[], float], manifest: str | None,
            heads: dict[str, QueryHead], detail: dict[str, Any], state_id: str, owner: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "state_id": state_id,
        "owner": owner,
        "epoch": epoch,
        "writer": holder.writer,
        "nonce": uuid.uuid4().hex,
        "time_ms": int(clock() * 1000),
        "manifest": manifest,
        "heads": heads_to_json(heads),
        "detail": detail,
    }


def _describe_heads(heads: dict[str, QueryHead]) -> str:
    if not heads:
        return "no batch committed yet"
    return ", ".join(f"{query} at batch {head.batch}" for query, head in sorted(heads.items()))


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat (after the command name, which may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""
