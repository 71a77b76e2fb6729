"""A storage seen from one of its folders: keys relative to ``prefix`` (a shared table's
folder inside its publisher's state, for instance)."""

from __future__ import annotations

import builtins

from spark_app.storage.base import FileEntry, Storage, join


class ScopedStorage:
    def __init__(self, inner: Storage, prefix: str) -> None:
        self.inner = inner
        self._prefix = prefix.strip("/")

    @property
    def root_uri(self) -> str:
        return f"{self.inner.root_uri.rstrip('/')}/{self._prefix}"

    def _key(self, key: str) -> str:
        joined = join(self._prefix, key)
        # join drops a trailing '/', which says "a folder" to list and delete_prefix.
        return joined + "/" if key.endswith("/") or not key else joined

    def read(self, key: str) -> bytes:
        return self.inner.read(self._key(key))

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self.inner.read_range(self._key(key), start, end)

    def write(self, key: str, data: bytes) -> None:
        self.inner.write(self._key(key), data)

    def write_file(self, key: str, path: str) -> None:
        self.inner.write_file(self._key(key), path)

    def read_file(self, key: str, path: str) -> None:
        self.inner.read_file(self._key(key), path)

    def create(self, key: str, data: bytes) -> bool:
        return self.inner.create(self._key(key), data)

    def list(self, prefix: str) -> list[str]:
        strip = len(self._prefix) + 1
        return [k[strip:] for k in self.inner.list(self._key(prefix))]

    def list_entries(self, folder: str) -> builtins.list[FileEntry]:  # list: the method above
        return self.inner.list_entries(self._key(folder))

    def delete(self, key: str) -> None:
        self.inner.delete(self._key(key))

    def delete_prefix(self, prefix: str) -> int:
        return self.inner.delete_prefix(self._key(prefix))

    def size(self, prefix: str) -> int:
        return self.inner.size(self._key(prefix))

    def spark_uri(self, key: str) -> str:
        return self.inner.spark_uri(join(self._prefix, key))

    def check_writable(self) -> None:
        self.inner.check_writable()
