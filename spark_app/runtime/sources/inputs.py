"""Listing and reading a file source's input: a local folder or an S3 prefix."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from spark_app.persistence import Backend
from spark_app.storage import FileEntry, RetryPolicy, Storage

# Writers should create files under a temporary name and rename them into place; names
# like these are in-progress files by convention and are never read (nor folders named so).
_IN_PROGRESS_PREFIXES = (".", "_")
_IN_PROGRESS_SUFFIXES = (".tmp", ".crc", ".inprogress", ".partial")


@dataclass(frozen=True)
class InputLocation:
    """Where a source's files live; a ``Backend`` so that S3 inputs share the S3 settings.
    Pickled into Spark's tasks: each process makes its own storage client, once."""

    backend: Backend
    pattern: str = "*"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """How long an unreachable input is retried: the driver's outage budget."""

    def list(self) -> list[FileEntry]:
        return [e for e in self._storage.list_entries("")
                if _is_complete(e.path) and fnmatch.fnmatch(e.path, self.pattern)]

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of an input file; raises ``NotFound`` if it is gone."""
        return self._storage.read_range(path, start, end)

    @cached_property
    def _storage(self) -> Storage:
        return self.backend.storage(self.retry)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_storage"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _is_complete(path: str) -> bool:
    parts = path.split("/")
    return not any(p.startswith(_IN_PROGRESS_PREFIXES) for p in parts) and not parts[-1].endswith(_IN_PROGRESS_SUFFIXES)
