"""Listing and reading a file source's input: a local folder or an S3 prefix."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

from spark_app.persistence import Backend
from spark_app.storage import FileEntry, S3Storage

# Writers should create files under a temporary name and rename them into place; names
# like these are in-progress files by convention and are never read.
_IN_PROGRESS_PREFIXES = (".", "_")
_IN_PROGRESS_SUFFIXES = (".tmp", ".crc", ".inprogress", ".partial")


@dataclass(frozen=True)
class InputLocation:
    """Where a source's files live; a ``Backend`` so that S3 inputs share the S3 settings."""

    backend: Backend
    pattern: str = "*"

    def list(self) -> list[FileEntry]:
        entries = self._list_s3() if self.backend.kind == "s3" else self._list_folder()
        return [e for e in entries if _is_complete(e.path) and fnmatch.fnmatch(e.path, self.pattern)]

    def read(self, path: str) -> bytes:
        if self.backend.kind == "s3":
            return self.backend.storage().read(path)
        with open(os.path.join(self.backend.root, path), "rb") as handle:
            return handle.read()

    def _list_folder(self) -> list[FileEntry]:
        root = self.backend.root
        if not os.path.isdir(root):
            return []
        entries = []
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith(_IN_PROGRESS_PREFIXES)]
            for name in files:
                full = os.path.join(folder, name)
                try:
                    stat = os.stat(full)
                except FileNotFoundError:
                    continue
                relative = os.path.relpath(full, root).replace(os.sep, "/")
                entries.append(FileEntry(relative, stat.st_size, int(stat.st_mtime * 1000)))
        return entries

    def _list_s3(self) -> list[FileEntry]:
        storage = self.backend.storage().inner  # type: ignore[attr-defined]
        assert isinstance(storage, S3Storage)
        return storage.list_entries()


def _is_complete(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return not name.startswith(_IN_PROGRESS_PREFIXES) and not name.endswith(_IN_PROGRESS_SUFFIXES)
