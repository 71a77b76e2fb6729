"""What a shared table's compaction may remove, as pure functions of its holds and its log.

The frontier is the oldest version that must stay readable whole: the lowest hold, but
never above the version that was the latest a margin ago (a reader that has just read
the latest version and not yet written its hold is protected by the margin) nor above
the latest version. Everything a version at or after the frontier needs stays:

* the snapshot of every version from the frontier on: the frontier's snapshot and the
  files the later commits added;
* the changes of every version from the frontier on: a commit's change data, or, when it
  wrote none, its added and removed files (read as inserts and deletes);
* the log from the newest checkpoint at or below the frontier on, so the frontier's
  snapshot can still be rebuilt.

Anything else in the table's folder goes (a data file nothing needs, once it is older
than the margin, so that a write in flight is never taken for garbage), and so do the
log's files below that checkpoint. Storage then follows the readers: what the frontier's
snapshot holds, plus what changed since the frontier, plus the margin's worth of churn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from spark_app.state.delta_log import CHANGE_DATA, Commit, log_keys_below
from spark_app.state.tables import Hold
from spark_app.storage import FileEntry

Timestamps = Callable[[int], int | None]
"""version -> its commit time in ms (None: the commit is gone)."""


@dataclass(frozen=True)
class HoldAge:
    hold: Hold
    behind: int
    """Versions the reader has not consumed (0: it is current)."""
    age_ms: int | None
    """How long the oldest version it has not consumed has existed (0 when current; None
    when that version's commit is gone, which means the hold is lost already)."""


def latest_before(latest: int, timestamp_ms: Timestamps, cutoff_ms: int) -> int:
    """The version that was the latest at ``cutoff_ms``: the newest committed before it (0
    if every version is newer)."""
    version = latest
    while version >= 0:
        committed = timestamp_ms(version)
        if committed is None or committed < cutoff_ms:
            return version
        version -= 1
    return 0


def frontier(holds: Iterable[Hold], latest: int, margin_version: int, recorded: int = 0) -> int:
    """The oldest version compaction keeps whole: the lowest hold, at most the version that
    was the latest a margin ago (``latest_before``) and the latest version; never below
    ``recorded``, an earlier round's, whose versions below are gone whatever a hold says (a
    reader refused for needing them leaves its hold: a lower frontier would let it start)."""
    return max(min(recorded, latest), min([latest, margin_version, *(h.version for h in holds)]))


def hold_age(hold: Hold, latest: int, timestamp_ms: Timestamps, now_ms: int) -> HoldAge:
    behind = max(0, latest - hold.next + 1)
    if behind == 0:
        return HoldAge(hold, 0, 0)
    committed = timestamp_ms(hold.next)
    return HoldAge(hold, behind, None if committed is None else max(0, now_ms - committed))


def blocking(ages: Iterable[HoldAge], frontier: int, latest: int) -> list[HoldAge]:
    """The live holds that keep compaction back: the lowest, at the frontier, below the latest
    version, of a reader behind it. A current changelog reader holds where its last batch
    started (a replay reads from there), which keeps that one batch and blocks nothing."""
    ages = list(ages)
    lowest = min((a.hold.version for a in ages), default=None)
    if lowest is None or lowest != frontier or frontier >= latest:
        return []
    return [a for a in ages if a.hold.version == lowest and a.behind]


def stale(ages: Iterable[HoldAge], max_age_ms: int | None) -> list[HoldAge]:
    """The holds to break: behind for longer than the table's maximum hold age."""
    if max_age_ms is None:
        return []
    return [a for a in ages if a.behind and (a.age_ms is None or a.age_ms > max_age_ms)]


def needed_files(snapshot: Iterable[str], commits: Iterable[Commit]) -> set[str]:
    """The data files the versions from the frontier on need, given the frontier's snapshot
    and the commits from the frontier to the latest: every later snapshot (what they
    added) and every version's changes."""
    needed = set(snapshot)
    for commit in commits:
        needed |= commit.adds | commit.change_files
    return needed


def mergeable(files: Iterable[str], entries: Iterable[FileEntry], below_bytes: int) -> int:
    """How many of a version's data ``files`` OPTIMIZE would merge: those under
    ``below_bytes`` (a file not listed counts as small). Delta rewrites only a bin of two
    or more such files of one partition (no deletion vectors, which a shared table does not
    have: Delta 4.4's OptimizeTableCommand), so below two it does nothing, but still rebuilds
    the table's snapshot with Spark jobs to find that out."""
    sizes = {e.path: e.size for e in entries}
    return sum(1 for f in files if sizes.get(f, 0) < below_bytes)


def log_cleanup_below(checkpoints: Sequence[int], frontier_version: int) -> int | None:
    """The version below which the log may go: the newest checkpoint at or below the
    frontier (None: there is none, so the log must stay whole)."""
    usable = [c for c in checkpoints if c <= frontier_version]
    return max(usable) if usable else None


def doomed_log_keys(keys: Sequence[str], checkpoints: Sequence[int], frontier_version: int) -> list[str]:
    below = log_cleanup_below(checkpoints, frontier_version)
    return [] if below is None else log_keys_below(list(keys), below)


def data_file(path: str) -> str | None:
    """The data file that a listed path is, or is the checksum of (Hadoop's local
    filesystem writes ``.<name>.crc`` beside each file); None for anything else (the log,
    the holds, hidden folders)."""
    folders, _, name = path.rpartition("/")
    if name.startswith(".") and name.endswith(".crc"):
        name = name[1:-4]
    parts = folders.split("/") if folders else []
    if parts and parts[0] == CHANGE_DATA.rstrip("/"):
        parts = parts[1:]
    if not name or name.startswith(("_", ".")) or any(p.startswith(("_", ".")) for p in parts):
        return None
    return f"{folders}/{name}" if folders else name


def doomed_data_files(entries: Iterable[FileEntry], needed: set[str], now_ms: int, margin_ms: int) -> list[str]:
    """Listed paths (relative to the table) to delete: data files no version from the
    frontier on needs, with their checksums, once every one of them is older than the margin."""
    groups: dict[str, list[FileEntry]] = {}
    for entry in entries:
        file = data_file(entry.path)
        if file is not None and file not in needed:
            groups.setdefault(file, []).append(entry)
    doomed: list[str] = []
    for group in groups.values():
        if all(e.mtime_ms < now_ms - margin_ms for e in group):
            doomed.extend(e.path for e in group)
    return sorted(doomed)
