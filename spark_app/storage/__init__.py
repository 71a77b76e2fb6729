"""Storage backends for persisted state: one contract, a filesystem and an S3 implementation.

This layer knows nothing of Spark, of the metadata log or of the user API.
"""

from spark_app.storage.base import (
    FileEntry,
    NotFound,
    Storage,
    StorageError,
    StorageMisconfigured,
    StorageUnavailable,
    join,
)
from spark_app.storage.filesystem import FilesystemStorage
from spark_app.storage.retry import RetryingStorage, RetryPolicy
from spark_app.storage.s3 import S3Location, S3Storage
from spark_app.storage.scoped import ScopedStorage

__all__ = [
    "FileEntry",
    "FilesystemStorage",
    "NotFound",
    "RetryPolicy",
    "RetryingStorage",
    "S3Location",
    "S3Storage",
    "ScopedStorage",
    "Storage",
    "StorageError",
    "StorageMisconfigured",
    "StorageUnavailable",
    "join",
]
