"""The storage contract that every persistence backend implements.

Keys are relative, '/'-separated paths under the backend's root. Two guarantees matter
to the layers above, and the shared test suite
(tests/integration/state/test_storage_contract.py) checks them against every implementation:

* ``write`` (and ``write_file``) replaces a key atomically: a reader sees the old bytes
  or the new bytes, never a prefix of the new ones.
* ``create`` is put-if-absent: of several writers racing for one key exactly one
  succeeds, and the key then holds that writer's complete bytes. This is what the
  metadata log's fencing is built on (exclusive create on a filesystem, ``If-None-Match: *``
  on S3).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class StorageError(Exception):
    """Base class of the errors a backend raises."""


class NotFound(StorageError):
    """The key does not exist."""


class StorageUnavailable(StorageError):
    """A transient failure (network, throttling, 5xx): retrying later may succeed."""


class StorageMisconfigured(StorageError):
    """A failure that retrying cannot fix (missing bucket, bad credentials, unwritable path).

    The message is one sentence a user can act on.
    """


@dataclass(frozen=True)
class FileEntry:
    """A stored file or object, as a listing reports it."""

    path: str
    """Relative to the listed root, '/'-separated."""
    size: int
    mtime_ms: int


@runtime_checkable
class Storage(Protocol):
    """A durable byte store rooted at one location."""

    @property
    def root_uri(self) -> str:
        """Where the backend is rooted, for messages and for ``spark_app inspect``."""
        ...

    def read(self, key: str) -> bytes:
        """Returns the bytes stored at ``key``; raises ``NotFound``."""
        ...

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Returns bytes ``start`` to ``end`` (exclusive) of ``key``, fewer at its end;
        raises ``NotFound``."""
        ...

    def write(self, key: str, data: bytes) -> None:
        """Stores ``data`` at ``key``, replacing any previous value atomically."""
        ...

    def create(self, key: str, data: bytes) -> bool:
        """Stores ``data`` at ``key`` only if the key is absent; returns whether it did."""
        ...

    def write_file(self, key: str, path: str) -> None:
        """Stores the local file ``path`` at ``key``, replacing any previous value
        atomically, as ``write`` does; streamed, never held whole in memory (a keyed
        output's snapshot is a gigabyte at 16M keys)."""
        ...

    def read_file(self, key: str, path: str) -> None:
        """Writes the bytes stored at ``key`` to the local file ``path``, streamed;
        raises ``NotFound``."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Returns the keys that start with ``prefix``, sorted."""
        ...

    def list_entries(self, folder: str) -> builtins.list[FileEntry]:  # list: the method above
        """Every file under ``folder`` (a key prefix ending in '/', or '' for the root)
        with its size and modification time, paths relative to the folder, sorted."""
        ...

    def delete(self, key: str) -> None:
        """Removes ``key`` if it exists."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Removes every key under ``prefix``; returns how many were removed."""
        ...

    def size(self, prefix: str) -> int:
        """Returns the total size in bytes of the keys under ``prefix``."""
        ...

    def spark_uri(self, key: str) -> str:
        """Returns the URI under which Spark (Hadoop FileSystem) reaches ``key``."""
        ...

    def check_writable(self) -> None:
        """Raises ``StorageMisconfigured`` unless the root exists and can be written
        (``StorageUnavailable`` if that cannot be told now)."""
        ...


def join(*parts: str) -> str:
    """Joins key parts with '/', ignoring empty parts and stray slashes."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))
