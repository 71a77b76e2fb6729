"""Shared tables: who reads a published table, and which of its versions they still need.

A pipeline publishes a keyed table (a Delta table at ``<state root>/tables/<name>``, one
version per committed batch) that other pipelines read, as a changelog or as a lookup.
Like a differential-dataflow arrangement's trace handles, every reader holds the oldest
version it may still need, and the publisher's compaction never removes what a hold
needs. The holds live beside the table, one small JSON object per reader:

    <table>/_holds/<namespace>__<pipeline>__<persistent id>.json          the hold
    <table>/_holds/<namespace>__<pipeline>__<persistent id>.broken.json   the publisher broke it
    <table>/_compaction/frontier.json                                     where the history starts

A hold is written by its reader after each of its commits (an atomic replace: a reader's
hold only moves forward, and only its reader writes it). A hold older than the table's
maximum hold age is broken by the publisher: a marker created with put-if-absent, never
removed by the reader it names, so that a reader cannot undo the break by a late update.
The frontier is the oldest version the publisher still keeps whole; a reader that needs
an older one refuses to start (``HoldBroken``) instead of failing on missing files.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from spark_app.storage import NotFound, Storage, join

log = logging.getLogger("spark_app.state")
T = TypeVar("T")

TABLES = "tables"
"""The folder of a publisher's state root that holds its tables."""
HOLDS = "_holds/"
FRONTIER_KEY = "_compaction/frontier.json"
OWN_FOLDERS = (HOLDS, "_compaction/")
"""What spark_app keeps inside a table's folder, beside Delta's own files."""
_SEPARATOR = "__"
_TABLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")
_HOLD_KEY = re.compile(r"^_holds/([^/]+)\.json$")
CHANGELOG = "changelog"
LOOKUP = "lookup"
BACKFILL = "backfill"
"""A changelog read with the keyed backfill (spark_app.runtime.sources.delta_table): its
position is the plans its reader committed, each of which reached a table version."""
BACKFILL_FORMAT = "table/backfill"
"""Such a source's format in the state's identity (spark_app.state.identity); "table" is
a changelog read with Delta's own streaming source."""
KEY_PROPERTY = "spark_app.key"
"""The table property in which the publisher records the table's key (a JSON list of
column names), so that a reader can backfill the table in key order."""
CHANGE_DIFFS = {"insert": 1, "update_postimage": 1, "update_preimage": -1, "delete": -1}
"""Delta's change data feed (``_change_type``) as changelog rows: an insert adds a row, a
delete retracts one, and an update retracts the old row and adds the new one."""


class TableError(ValueError):
    """A table reference or name that cannot be used; the message says which and why."""


def check_table_name(name: str) -> str:
    if not _TABLE_NAME.match(name or ""):
        raise TableError(f"table name {name!r} must be 1 to 63 letters, digits, '_', '.' or '-', starting with "
                         "a letter or digit")
    return name


def encode_key(key: Sequence[str]) -> str:
    return json.dumps(list(key))


def decode_key(value: str | None, table: str) -> tuple[str, ...]:
    """The key a publisher recorded in the table's KEY_PROPERTY; an error that says what
    to do where it recorded none (a table created before keys were recorded gets its key
    when its publisher starts again)."""
    if value is None:
        raise TableError(f"table {table} records no key ({KEY_PROPERTY}), which a backfill reads it by: restart its "
                         "publisher with this version of spark_app, which records it, or read the table without "
                         "backfill=True")
    try:
        key = json.loads(value)
    except ValueError:
        key = None
    if not isinstance(key, list) or not key or not all(isinstance(k, str) and k for k in key):
        raise TableError(f"table {table}: its {KEY_PROPERTY} property is {value!r}, not a list of column names; "
                         "restart its publisher, which records it again")
    return tuple(key)


@dataclass(frozen=True)
class TableRef:
    """A published table: its publisher (namespace, PersistentPipeline) and its name."""

    namespace: str
    pipeline: str
    name: str

    @classmethod
    def parse(cls, text: str, default_namespace: str) -> TableRef:
        """``pipeline/name`` (in the reader's own namespace) or ``namespace/pipeline/name``."""
        parts = text.split("/")
        if len(parts) == 2:
            parts = [default_namespace, *parts]
        if len(parts) != 3 or not all(parts):
            raise TableError(f"table {text!r} must be 'pipeline/name' or 'namespace/pipeline/name'")
        return cls(parts[0], parts[1], check_table_name(parts[2]))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pipeline}/{self.name}"


@dataclass(frozen=True)
class ReaderId:
    """Who holds a version: a reader pipeline's input, named by namespace, pipeline and
    the input's persistent id (stable across the reader's restarts, like its state)."""

    namespace: str
    pipeline: str
    persistent_id: str

    @classmethod
    def for_pipeline(cls, owner: str, persistent_id: str, state_id: str) -> ReaderId:
        """``owner`` is the PersistentPipeline (namespace/name) a driver runs for, or a local
        run's name; a local run without one is named after its state."""
        namespace, _, name = owner.rpartition("/")
        return cls(namespace or "local", name or f"state-{state_id[:12]}", persistent_id)

    @property
    def key(self) -> str:
        """A file name: Kubernetes names hold no '_' (so the separator is unambiguous)."""
        return _SEPARATOR.join((self.namespace, self.pipeline, self.persistent_id))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pipeline}/{self.persistent_id}"


@dataclass(frozen=True)
class Hold:
    """One reader's hold on a table."""

    reader: ReaderId
    kind: str
    """CHANGELOG, BACKFILL or LOOKUP."""
    version: int
    """The oldest version the reader may still need: compaction keeps it and everything after it."""
    next: int
    """The first version the reader has not consumed yet (a changelog: the same as
    ``version``; a lookup or a backfill: one after the version it last read). The hold
    is behind, and ages, once the table has this version."""
    state_id: str
    """The reader's stored state: a reader reset to empty state holds afresh."""
    updated_ms: int

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "reader": asdict(self.reader)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Hold:
        return cls(reader=ReaderId(**value["reader"]), kind=str(value["kind"]), version=int(value["version"]),
                   next=int(value["next"]), state_id=str(value["state_id"]), updated_ms=int(value["updated_ms"]))


@dataclass(frozen=True)
class Broken:
    """The publisher broke a hold that was older than the table's maximum hold age."""

    reader: ReaderId
    state_id: str
    version: int
    """The version the hold was at."""
    at_ms: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "reader": asdict(self.reader)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Broken:
        return cls(reader=ReaderId(**value["reader"]), state_id=str(value["state_id"]),
                   version=int(value["version"]), at_ms=int(value["at_ms"]), reason=str(value["reason"]))


@dataclass(frozen=True)
class Frontier:
    """What the publisher's last compaction kept: every version from ``version`` on can be
    read whole (its snapshot and its changes); older ones may be gone."""

    version: int
    latest: int
    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Frontier:
        return cls(version=int(value["version"]), latest=int(value["latest"]), at_ms=int(value["at_ms"]))


@dataclass(frozen=True)
class ChangelogPosition:
    """Where a changelog reader stands in a table: Delta's streaming source offset, as
    Spark's offset log records it, parsed once. The reader's commit carries the offset;
    this is its typed view."""

    table_id: str
    """Delta's id of the table (a table rebuilt at the same place has another)."""
    version: int
    """The version being read (its changes, or its contents while ``snapshot``)."""
    index: int
    """How far into that version (-1: nothing of it yet)."""
    snapshot: bool
    """Still reading the table's contents as of ``version`` (the first start)."""

    @classmethod
    def from_offset(cls, offset: dict[str, Any]) -> ChangelogPosition:
        try:
            return cls(table_id=str(offset["reservoirId"]), version=int(offset["reservoirVersion"]),
                       index=int(offset.get("index", -1)), snapshot=bool(offset.get("isStartingVersion", False)))
        except (KeyError, TypeError, ValueError) as error:
            raise TableError(f"not a Delta streaming offset ({error}): {offset}") from None

    @property
    def needed(self) -> int:
        """The oldest version the reader still needs: the one it is in."""
        return self.version


@dataclass(frozen=True)
class LookupPosition:
    """The version a lookup read in a batch, as the reader's commit records it."""

    version: int

    def to_offset(self) -> dict[str, Any]:
        return {"table_version": self.version}

    @classmethod
    def from_offset(cls, offset: dict[str, Any]) -> LookupPosition | None:
        version = offset.get("table_version")
        return None if version is None else cls(int(version))


class HoldBroken(Exception):
    """A reader needs versions of a table that its publisher no longer keeps."""

    def __init__(self, table: str, reader: ReaderId, needed: int, frontier: int | None,
                 broken: Broken | None, reset_hint: str) -> None:
        why = (f"its hold was broken by the publisher ({broken.reason})" if broken is not None
               else "its hold was released (the reader was deleted, or its hold removed by hand)")
        gone = f"versions before {frontier} are gone" if frontier is not None else "those versions may be gone"
        super().__init__(
            f"table {table}: reader {reader} needs version {needed}, but {why}, and the table's {gone}. "
            f"Rebuild this reader from the table's current contents: {reset_hint}")
        self.table = table
        self.reader = reader


class HoldRegistry:
    """The holds of one table, in storage rooted at the table's folder."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    @property
    def storage(self) -> Storage:
        return self._storage

    def holds(self) -> list[Hold]:
        found = []
        for key in self._storage.list(HOLDS):
            match = _HOLD_KEY.match(key)
            if match is None or match.group(1).endswith(".broken"):
                continue
            hold = self._read(key, Hold.from_json)
            if hold is not None:
                found.append(hold)
        return found

    def hold(self, reader: ReaderId) -> Hold | None:
        return self._read(self._key(reader), Hold.from_json)

    def put(self, hold: Hold) -> None:
        self._storage.write(self._key(hold.reader), _encode(hold.to_json()))

    def release(self, reader: ReaderId) -> bool:
        """Drops the reader's hold (its PersistentPipeline was deleted); returns whether it had one."""
        had = self.hold(reader) is not None
        self._storage.delete(self._key(reader))
        return had

    def broken(self, reader: ReaderId) -> Broken | None:
        return self._read(self._key(reader, broken=True), Broken.from_json)

    def mark_broken(self, broken: Broken) -> bool:
        """Records the break once (put-if-absent); returns whether this call recorded it."""
        return self._storage.create(self._key(broken.reader, broken=True), _encode(broken.to_json()))

    def clear_broken(self, reader: ReaderId) -> None:
        """Only for a reader that starts afresh (new state): the break was its predecessor's."""
        self._storage.delete(self._key(reader, broken=True))

    def frontier(self) -> Frontier | None:
        return self._read(FRONTIER_KEY, Frontier.from_json)

    def set_frontier(self, frontier: Frontier) -> None:
        self._storage.write(FRONTIER_KEY, _encode(frontier.to_json()))

    def _read(self, key: str, parse: Callable[[dict[str, Any]], T]) -> T | None:
        try:
            data = self._storage.read(key)
        except NotFound:
            return None
        try:
            return parse(json.loads(data))
        except (ValueError, KeyError, TypeError) as error:
            # A damaged hold is ignored by compaction, which then may compact what it needed:
            # say so loudly. Its reader rewrites it at its next commit.
            log.warning("ignoring %s/%s, which is not a hold record (%s)", self._storage.root_uri, key, error)
            return None

    @staticmethod
    def _key(reader: ReaderId, broken: bool = False) -> str:
        return join(HOLDS, f"{reader.key}{'.broken' if broken else ''}.json")


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True).encode()
