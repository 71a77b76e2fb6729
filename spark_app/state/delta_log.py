"""A Delta table's transaction log, read through spark_app's storage (no Spark).

Enough of the Delta protocol for the holds and the compaction of shared tables: which
versions and checkpoints the log holds, and what each commit did (its time, the files it
added and removed, its change-data files, its transaction ids). The log's own files are
``_delta_log/<version, 20 digits>.json`` (one commit each, a JSON action a line),
``<version>.checkpoint[...].parquet`` (the table's state at that version), ``<version>.crc``
and ``_last_checkpoint``. File paths in actions are relative to the table and URL-encoded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from urllib.parse import unquote

from spark_app.storage import NotFound, Storage, join

LOG = "_delta_log/"
CHANGE_DATA = "_change_data/"
_COMMIT = re.compile(r"^_delta_log/(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^_delta_log/(\d{20})\.checkpoint(\.\d{10}\.\d{10})?\.parquet$")
# With the checksums that Hadoop's local filesystem writes beside each file (.<name>.crc).
_VERSIONED = re.compile(r"^_delta_log/\.?(\d{20})\.(?:json|crc|checkpoint(?:\.\d{10}\.\d{10})?\.parquet)(?:\.crc)?$")
_COMPACTED = re.compile(r"^_delta_log/\.?\d{20}\.(\d{20})\.compacted\.json(?:\.crc)?$")


class LogDamaged(Exception):
    """A commit file of the table is not a Delta commit."""


@dataclass(frozen=True)
class Commit:
    version: int
    timestamp_ms: int
    operation: str = ""
    adds: frozenset[str] = frozenset()
    removes: frozenset[str] = frozenset()
    change_data: frozenset[str] = frozenset()
    """The change-data files (``_change_data/...``) written with it."""
    txns: dict[str, int] = field(default_factory=dict)
    """Transaction ids set by the commit: application id -> its version (a batch)."""
    data_change: bool = True
    """Whether the commit changed the table's contents (OPTIMIZE only rearranges them)."""
    metrics: dict[str, int] = field(default_factory=dict)
    """The operation's numeric metrics (a MERGE's numTargetRowsInserted, ...)."""
    schema: str | None = None
    """The table's schema (Spark's JSON form) if the commit sets the table's metadata."""
    plain: bool = True
    """Whether a reader may take the commit's added files as plain Parquet files: no
    deletion vectors, partition values, column mapping or reader features."""

    @property
    def change_files(self) -> frozenset[str]:
        """The files a reader of this version's changes reads: its change data if it wrote
        any, else its added and removed files (read as inserts and deletes); none for a
        commit that changed no data (OPTIMIZE)."""
        if self.change_data:
            return self.change_data
        return self.adds | self.removes if self.data_change else frozenset()


def commit_key(version: int) -> str:
    return join(LOG, f"{version:020d}.json")


def parse_commit(version: int, data: bytes) -> Commit:
    adds: set[str] = set()
    removes: set[str] = set()
    change_data: set[str] = set()
    txns: dict[str, int] = {}
    metrics: dict[str, int] = {}
    timestamp, operation, data_change, schema, plain = 0, "", False, None, True
    try:
        for line in data.decode().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "commitInfo" in action:
                info = action["commitInfo"]
                timestamp = int(info.get("inCommitTimestamp") or info.get("timestamp") or 0)
                operation = str(info.get("operation", ""))
                metrics = {str(k): int(v) for k, v in (info.get("operationMetrics") or {}).items()
                           if str(v).lstrip("-").isdigit()}
            elif "add" in action:
                adds.add(unquote(action["add"]["path"]))
                data_change = data_change or bool(action["add"].get("dataChange", True))
                plain = plain and not action["add"].get("deletionVector") and not action["add"].get("partitionValues")
            elif "metaData" in action:
                # Read only for the plain-Parquet reads of the iterate store: a metadata action
                # without a schema makes the commit not plain rather than the log damaged.
                metadata = action["metaData"]
                schema = metadata.get("schemaString")
                mapping = (metadata.get("configuration") or {}).get("delta.columnMapping.mode", "none")
                plain = plain and schema is not None and not metadata.get("partitionColumns") and mapping == "none"
            elif "protocol" in action:
                plain = plain and int(action["protocol"].get("minReaderVersion", 1)) == 1
            elif "remove" in action:
                removes.add(unquote(action["remove"]["path"]))
                data_change = data_change or bool(action["remove"].get("dataChange", True))
            elif "cdc" in action:
                change_data.add(unquote(action["cdc"]["path"]))
                data_change = True
            elif "txn" in action:
                txns[str(action["txn"]["appId"])] = int(action["txn"]["version"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise LogDamaged(f"{commit_key(version)} is not a Delta commit ({error})") from None
    return Commit(version, timestamp, operation, frozenset(adds), frozenset(removes), frozenset(change_data),
                  txns, data_change, metrics, schema, plain)


class TableLog:
    """The log of the Delta table rooted at ``storage``. Commits never change once
    written, so each is read once per instance."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._commits: dict[int, Commit] = {}

    def keys(self) -> list[str]:
        return self._storage.list(LOG)

    def versions(self, keys: list[str] | None = None) -> list[int]:
        """The versions whose commit files the log still holds, oldest first."""
        return sorted(int(m.group(1)) for k in (keys if keys is not None else self.keys())
                      if (m := _COMMIT.match(k)))

    def checkpoints(self, keys: list[str] | None = None) -> list[int]:
        return sorted({int(m.group(1)) for k in (keys if keys is not None else self.keys())
                       if (m := _CHECKPOINT.match(k))})

    def latest(self) -> int | None:
        versions = self.versions()
        return versions[-1] if versions else None

    def exists(self) -> bool:
        return self.latest() is not None

    def commit(self, version: int) -> Commit:
        """Raises ``NotFound`` for a version whose commit file is gone (or never was)."""
        found = self._commits.get(version)
        if found is None:
            found = parse_commit(version, self._storage.read(commit_key(version)))
            self._commits[version] = found
        return found

    def timestamp_ms(self, version: int) -> int | None:
        try:
            return self.commit(version).timestamp_ms
        except NotFound:
            return None

    def txn_version(self, app_id: str, txn: int, latest: int | None = None) -> int | None:
        """The version whose commit carries transaction ``txn`` of ``app_id`` (a batch's
        write), searched from the newest down; None if the log has none."""
        top = self.latest() if latest is None else latest
        if top is None:
            return None
        for version in range(top, -1, -1):
            try:
                seen = self.commit(version).txns.get(app_id)
            except NotFound:
                return None
            if seen is not None and seen <= txn:
                return version if seen == txn else None
        return None

    def files_at(self, version: int) -> tuple[str, frozenset[str]] | None:
        """The schema and data files of ``version``, replayed from its commits (0 to
        ``version``) where they are plain Parquet files; None if a commit is gone (the log
        was cleaned up behind a checkpoint) or needs more of Delta than that."""
        schema: str | None = None
        files: frozenset[str] = frozenset()
        for v in range(version + 1):
            try:
                commit = self.commit(v)
            except (NotFound, LogDamaged):
                return None
            if not commit.plain:
                return None
            schema = commit.schema or schema
            files = after(files, commit)
        return (schema, files) if schema is not None else None

    def forget(self, below: int) -> None:
        """Drops the cached commits older than ``below`` (their files are gone)."""
        for version in [v for v in self._commits if v < below]:
            del self._commits[version]


def after(files: AbstractSet[str], commit: Commit) -> frozenset[str]:
    """A version's data files, given the previous version's and the commit between. A file
    removed and added in one commit (its deletion vector replaced) stays."""
    return frozenset((files - commit.removes) | commit.adds)


def log_keys_below(keys: list[str], version: int) -> list[str]:
    """The log's files that only versions before ``version`` need: their commits, checksums,
    checkpoints and compacted ranges. ``_last_checkpoint`` and anything unknown stay."""
    doomed = []
    for key in keys:
        versioned = _VERSIONED.match(key)
        compacted = _COMPACTED.match(key)
        if (versioned and int(versioned.group(1)) < version) or (compacted and int(compacted.group(1)) < version):
            doomed.append(key)
    return doomed
