"""Retries a backend's transient failures with capped exponential backoff and jitter."""

from __future__ import annotations

import builtins
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from spark_app.storage.base import FileEntry, Storage, StorageUnavailable

log = logging.getLogger("spark_app.storage")
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How long a storage outage is ridden out before the pipeline gives up."""

    initial_delay_s: float = 0.5
    """The first wait; each following wait doubles."""
    max_delay_s: float = 30.0
    """The cap on a single wait."""
    deadline_s: float = 900.0
    """Total time spent retrying one operation before the error is raised."""


class RetryingStorage:
    """Wraps a ``Storage`` so that ``StorageUnavailable`` is retried until a deadline.

    Other errors (``NotFound``, ``StorageMisconfigured``) pass through at once: retrying
    a missing bucket only delays the message the user needs.
    """

    def __init__(
        self,
        inner: Storage,
        policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.inner = inner
        self._policy = policy or RetryPolicy()
        self._sleep = sleep

    @property
    def root_uri(self) -> str:
        return self.inner.root_uri

    def read(self, key: str) -> bytes:
        return self._retry(lambda: self.inner.read(key), f"read {key}")

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self._retry(lambda: self.inner.read_range(key, start, end), f"read {key}")

    def write(self, key: str, data: bytes) -> None:
        self._retry(lambda: self.inner.write(key, data), f"write {key}")

    def write_file(self, key: str, path: str) -> None:
        self._retry(lambda: self.inner.write_file(key, path), f"write {key}")

    def read_file(self, key: str, path: str) -> None:
        self._retry(lambda: self.inner.read_file(key, path), f"read {key}")

    def create(self, key: str, data: bytes) -> bool:
        # An ambiguous failure may have created the key: callers that need to know whose
        # bytes are stored read them back (the metadata log does).
        return self._retry(lambda: self.inner.create(key, data), f"create {key}")

    def list(self, prefix: str) -> list[str]:
        return self._retry(lambda: self.inner.list(prefix), f"list {prefix}")

    def list_entries(self, folder: str) -> builtins.list[FileEntry]:  # list: the method above
        return self._retry(lambda: self.inner.list_entries(folder), f"list {folder}")

    def delete(self, key: str) -> None:
        self._retry(lambda: self.inner.delete(key), f"delete {key}")

    def delete_prefix(self, prefix: str) -> int:
        return self._retry(lambda: self.inner.delete_prefix(prefix), f"delete {prefix}")

    def size(self, prefix: str) -> int:
        return self._retry(lambda: self.inner.size(prefix), f"size of {prefix}")

    def spark_uri(self, key: str) -> str:
        return self.inner.spark_uri(key)

    def check_writable(self) -> None:
        self._retry(self.inner.check_writable, "the writability check")

    def _retry(self, operation: Callable[[], T], what: str) -> T:
        delay = self._policy.initial_delay_s
        waited = 0.0
        attempt = 1
        while True:
            try:
                return operation()
            except StorageUnavailable as error:
                if waited >= self._policy.deadline_s:
                    raise
                pause = min(delay, self._policy.max_delay_s) * random.uniform(0.8, 1.2)
                log.warning(
                    "storage unavailable during %s (%s); retrying in %.1fs (attempt %d)",
                    what, error, pause, attempt,
                )
                self._sleep(pause)
                waited += pause
                delay *= 2
                attempt += 1
