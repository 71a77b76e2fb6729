"""A storage backend on a local or mounted filesystem (a PersistentVolumeClaim in a pod)."""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import tempfile
from pathlib import Path

from spark_app.faults import IN_STORAGE_WRITE, crash_point
from spark_app.storage.base import FileEntry, NotFound, StorageMisconfigured, StorageUnavailable

# Errors of a network volume (NFS, CSI) that is briefly gone: wait them out.
_TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.ESTALE, errno.ENOTCONN, errno.ETIMEDOUT, errno.EAGAIN,
                               errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNRESET, errno.ENOSPC})


class FilesystemStorage:
    """Keys map to files under ``root``.

    Atomic replace is write-to-temp, fsync, rename. Put-if-absent is write-to-temp, fsync,
    then ``link``: unlike ``O_EXCL`` on the final name, a reader can never observe a
    half-written file, and ``link`` fails with EEXIST if another writer got there first.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root).absolute()

    @property
    def root(self) -> Path:
        return self._root

    @property
    def root_uri(self) -> str:
        return str(self._root)

    def _path(self, key: str) -> Path:
        return self._root / key if key else self._root

    def read(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise NotFound(key) from None
        except OSError as error:
            raise _translate(error, self._path(key)) from error

    def read_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self._path(key), "rb") as handle:
                handle.seek(start)
                return handle.read(max(0, end - start))
        except FileNotFoundError:
            raise NotFound(key) from None
        except OSError as error:
            raise _translate(error, self._path(key)) from error

    def write(self, key: str, data: bytes) -> None:
        target = self._path(key)
        try:
            temp = self._write_temp(target, data)
            crash_point(IN_STORAGE_WRITE)
            os.replace(temp, target)
            _fsync(target.parent)
        except OSError as error:
            raise _translate(error, target) from error

    def write_file(self, key: str, path: str) -> None:
        target = self._path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
            os.close(fd)
            try:
                shutil.copyfile(path, temp)  # the kernel copies (copy_file_range, sendfile)
                _fsync(temp)
                crash_point(IN_STORAGE_WRITE)
                os.replace(temp, target)
            except BaseException:
                if os.path.exists(temp):
                    os.unlink(temp)
                raise
            _fsync(target.parent)
        except OSError as error:
            raise _translate(error, target) from error

    def read_file(self, key: str, path: str) -> None:
        try:
            shutil.copyfile(self._path(key), path)
        except FileNotFoundError:
            if not self._path(key).exists():
                raise NotFound(key) from None
            raise
        except OSError as error:
            raise _translate(error, self._path(key)) from error

    def create(self, key: str, data: bytes) -> bool:
        target = self._path(key)
        try:
            temp = self._write_temp(target, data)
            crash_point(IN_STORAGE_WRITE)
            try:
                os.link(temp, target)
            except FileExistsError:
                return False
            finally:
                os.unlink(temp)
            _fsync(target.parent)
            return True
        except OSError as error:
            raise _translate(error, target) from error

    def list(self, prefix: str) -> list[str]:
        # A prefix is a key prefix, not a folder: walk the deepest folder it names.
        base = self._path(prefix) if prefix.endswith("/") or not prefix else self._path(prefix).parent
        if not base.is_dir():
            return []
        keys = []
        for folder, _, files in os.walk(base):
            for name in files:
                if name.startswith(".tmp-"):
                    continue
                key = os.path.relpath(os.path.join(folder, name), self._root).replace(os.sep, "/")
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def list_entries(self, folder: str) -> builtins.list[FileEntry]:  # list: the method above
        base = self._path(folder)
        entries = []
        for key in self.list(folder):
            try:
                stat = self._path(key).stat()
            except FileNotFoundError:
                continue
            relative = os.path.relpath(self._path(key), base).replace(os.sep, "/")
            entries.append(FileEntry(relative, stat.st_size, int(stat.st_mtime * 1000)))
        return entries

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        for key in keys:
            self.delete(key)
        folder = self._path(prefix)
        if prefix.endswith("/") and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
        return len(keys)

    def size(self, prefix: str) -> int:
        total = 0
        for key in self.list(prefix):
            try:
                total += self._path(key).stat().st_size
            except FileNotFoundError:
                pass
        return total

    def spark_uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def check_writable(self) -> None:
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            probe = self._write_temp(self._root / "probe", b"")
            os.unlink(probe)
        except OSError as error:
            if error.errno in _TRANSIENT_ERRNOS:
                raise _translate(error, self._root) from error
            raise StorageMisconfigured(
                f"the state directory {self._root} is not writable ({error.strerror}); "
                "mount a writable volume there or choose another path"
            ) from error

    def _write_temp(self, target: Path, data: bytes) -> str:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            os.unlink(temp)
            raise
        return temp


def _fsync(path: str | Path) -> None:
    """Makes a file's bytes, or a folder's entries, durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _translate(error: OSError, path: Path) -> Exception:
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StorageMisconfigured(f"cannot write {path}: {error.strerror}")
    if error.errno == errno.ENOSPC:
        return StorageUnavailable(f"no space left on the device holding {path}")
    # Anything else (EIO, ESTALE of a network volume, ...) may pass: retried, then reported.
    return StorageUnavailable(f"{path}: {error.strerror or error}")
