"""Finding and repairing damaged state: what ``spark_app inspect`` reports and ``spark_app
repair`` fixes where that is safe.

Damage here means a stored file that is not what spark_app wrote (truncated, or written
by something else), found by reading every file the next driver would read:

* the lease: advisory (the metadata log fences), so a damaged one is simply removed;
* metadata log entries: the newest good entry is a state the pipeline was in. Falling
  back to it is safe when Spark's checkpoint is rolled back with it: the commit-log
  entries of the batches after it are removed (and the offsets planned after the first
  of them), so Spark runs those batches again, reading the same files, and the outputs,
  cut back to the entry's positions, are written again exactly once. Damaged entries
  older than the newest good one are never read and are removed;
* file index segments: one that no committed offset and no logged Spark offset reaches
  into only lists files not read yet, so removing it makes them new again; one that
  holds files already read cannot be removed safely, and repair says so.

Whatever is removed is first copied to ``repairs/<time>/`` beside the state.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from spark_app.state.file_index import IndexCorrupted
from spark_app.state.log import PREFIX as LOG_PREFIX
from spark_app.state.log import LogCorrupted, MetadataLog, entry_key
from spark_app.state.records import heads_from_record
from spark_app.state.session import LEASE_KEY, LeaseDamaged, read_lease
from spark_app.storage import NotFound, Storage, join

_SEGMENT = re.compile(r"^sources/([^/]+)/files/(base-)?(\d{12})\.json$")
_BATCH_FILE = re.compile(r"^checkpoints/([^/]+)/(offsets|commits)/(\d+)$")


@dataclass(frozen=True)
class Damage:
    key: str
    problem: str
    fix: str
    """What repair does about it, or why it cannot."""
    safe: bool


@dataclass
class Plan:
    """What repair would do."""

    damage: list[Damage] = field(default_factory=list)
    remove_metadata: list[str] = field(default_factory=list)
    remove_snapshots: list[str] = field(default_factory=list)

    @property
    def safe(self) -> bool:
        return all(d.safe for d in self.damage)

    def to_json(self) -> dict[str, Any]:
        return {"damage": [d.__dict__ for d in self.damage], "safe": self.safe,
                "remove_metadata": self.remove_metadata, "remove_snapshots": self.remove_snapshots}


def plan_repair(metadata: Storage, snapshots: Storage) -> Plan:
    """Reads everything a driver would read; lists the damage and how to repair it."""
    plan = Plan()
    try:
        read_lease(metadata)
    except LeaseDamaged as damaged:
        plan.damage.append(Damage(LEASE_KEY, str(damaged).split(" (", 1)[0] + " is damaged", "remove it", True))
        plan.remove_metadata.append(LEASE_KEY)
    log = MetadataLog(metadata)
    good: Any = None
    for seq in reversed(log.sequence_numbers()):
        try:
            entry = log.entry(seq)
        except LogCorrupted as damaged:
            newest = good is None
            fix = ("fall back to the previous good entry, and roll Spark's checkpoint back to it"
                   if newest else "remove it (an older entry, never read)")
            plan.damage.append(Damage(damaged.key, f"metadata log entry {seq} is damaged", fix, True))
            plan.remove_metadata.append(damaged.key)
            continue
        if entry is not None and good is None:
            good = entry
    damaged_newest = any(d.key.startswith(LOG_PREFIX) and "fall back" in d.fix for d in plan.damage)
    if damaged_newest and good is None:
        plan.damage = [Damage(d.key, d.problem, "no good entry is left to fall back to: reset the state", False)
                       if d.key.startswith(LOG_PREFIX) else d for d in plan.damage]
    heads = heads_from_record(good.record) if good is not None else {}
    if damaged_newest and good is not None:
        plan.remove_snapshots += _batches_after(snapshots, {q: h.batch for q, h in heads.items()})
    _plan_index(snapshots, heads, plan)
    return plan


def _batches_after(snapshots: Storage, committed: dict[str, int]) -> list[str]:
    """Spark's commit-log entries after each query's committed batch, and its offset-log
    entries after the first batch it must run again."""
    doomed = []
    for key in snapshots.list("checkpoints/"):
        match = _BATCH_FILE.match(key)
        if not match:
            continue
        query, kind, batch = match.group(1), match.group(2), int(match.group(3))
        last = committed.get(query, -1)
        if (kind == "commits" and batch > last) or (kind == "offsets" and batch > last + 1):
            doomed.append(key)
    return doomed


def _plan_index(snapshots: Storage, heads: dict[str, Any], plan: Plan) -> None:
    reached: dict[str, int] = {}  # persistent id -> the most files any offset holds
    for head in heads.values():
        for pid, offset in head.offsets.items():
            reached[pid] = max(reached.get(pid, 0), int(offset.get("files", 0)) if isinstance(offset, dict) else 0)
    for key in snapshots.list("checkpoints/"):
        match = _BATCH_FILE.match(key)
        if match and match.group(2) == "offsets":
            for offset in _logged_offsets(snapshots, key):
                pid = offset.get("source")
                if pid and "files" in offset:
                    reached[pid] = max(reached.get(pid, 0), int(offset["files"]))
    for key in snapshots.list("sources/"):
        match = _SEGMENT.match(key)
        if not match:
            continue
        try:
            body = json.loads(snapshots.read(key))
            _ = body["start"], body["files"]
        except (ValueError, KeyError, TypeError, NotFound):
            pid, is_base, start = match.group(1), bool(match.group(2)), int(match.group(3))
            if not is_base and reached.get(pid, 0) <= start:
                plan.damage.append(Damage(key, f"file index segment of source {pid!r} is damaged",
                                          "remove it: no offset reaches into it, so its files are admitted again",
                                          True))
                plan.remove_snapshots.append(key)
            else:
                plan.damage.append(Damage(
                    key, f"file index segment of source {pid!r} is damaged",
                    f"cannot be removed safely: offsets reach file {reached.get(pid, 0)}, inside it; restore it "
                    "from a backup, or reset the state", False))


def _logged_offsets(snapshots: Storage, key: str) -> list[dict[str, Any]]:
    try:
        lines = snapshots.read(key).decode().splitlines()
    except (NotFound, UnicodeDecodeError):
        return []
    found = []
    for line in lines[2:]:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def apply_repair(metadata: Storage, snapshots: Storage, plan: Plan, now: float | None = None) -> str:
    """Carries out a safe plan: copies what it removes to ``repairs/<time>/``, then removes
    it. Returns where the copies are."""
    if not plan.safe:
        raise IndexCorrupted("the damage cannot be repaired safely: " + "; ".join(
            f"{d.key}: {d.fix}" for d in plan.damage if not d.safe))
    folder = join("repairs", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)))
    for storage, keys in ((metadata, plan.remove_metadata), (snapshots, plan.remove_snapshots)):
        for key in keys:
            try:
                storage.write(join(folder, key), storage.read(key))
            except NotFound:
                continue
            storage.delete(key)
    return folder


def render(plan: Plan) -> str:
    if not plan.damage:
        return "no damage found: every log entry, the lease and every file index segment read back"
    lines = [f"{d.key}: {d.problem}; {'will ' if d.safe else ''}{d.fix}" for d in plan.damage]
    if plan.remove_snapshots and any("fall back" in d.fix for d in plan.damage):
        lines.append(f"Spark's checkpoint: {len(plan.remove_snapshots)} commit/offset entries after the fallback "
                     "entry go, so those batches run again")
    return "\n".join(lines)


__all__ = ["Damage", "Plan", "apply_repair", "entry_key", "plan_repair", "render"]
