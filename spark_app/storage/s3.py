"""A storage backend on S3 or an S3-compatible server, through boto3.

Credentials come from boto3's standard chain (environment, shared files, instance or
pod identity); nothing here accepts a secret. Put-if-absent uses ``If-None-Match: *``,
which AWS S3 honours since 2024 and which the local test server honours too.
"""

from __future__ import annotations

import builtins
import os
import threading
from dataclasses import dataclass
from typing import Any

from spark_app.faults import IN_STORAGE_WRITE, crash_point
from spark_app.storage.base import (
    FileEntry,
    NotFound,
    StorageError,
    StorageMisconfigured,
    StorageUnavailable,
    join,
)

_CREDENTIAL_ERRORS = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
    "403",
}
_TRANSIENT_CODES = {
    "SlowDown",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "Throttling",
    "ThrottlingException",
    "RequestTimeTooSkewed",
    "ConditionalRequestConflict",
    "500",
    "502",
    "503",
    "504",
}


_PART_BYTES = 32 * 2**20
"""Snapshots larger than this go up and down in parts of this size."""
_TRANSFER_THREADS = 4
"""Parts in flight at once: a download or upload of a large snapshot is bound by the
round trips of one stream, not by the link."""
_CONNECTIONS = 32
"""Connections the process's one client keeps (boto3's default is 10). Every storage of the
process shares it: a file index's parallel reads beside snapshots going up in parts, the
lease's renewal and the commit. Beyond its pool urllib3 opens a connection and drops it
after the request, with a warning."""


@dataclass(frozen=True)
class S3Location:
    """Where an S3 backend lives; no credentials by design."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool = False

    @classmethod
    def parse(cls, uri: str, **kwargs: Any) -> S3Location:
        """Parses ``s3://bucket/prefix`` (or ``s3a://``)."""
        scheme, _, rest = uri.partition("://")
        if scheme not in ("s3", "s3a") or not rest:
            raise ValueError(f"not an S3 URI: {uri!r}; expected s3://bucket/prefix")
        bucket, _, prefix = rest.partition("/")
        return cls(bucket=bucket, prefix=prefix.strip("/"), **kwargs)

    @property
    def uri(self) -> str:
        return f"s3://{join(self.bucket, self.prefix)}"


class S3Storage:
    """Keys map to objects under ``s3://bucket/prefix/``."""

    def __init__(self, location: S3Location, client: Any | None = None) -> None:
        # botocore is imported here rather than with the module: boto3 takes 0.16 s to
        # import, which every Spark Python worker that imports spark_app would pay.
        from botocore.exceptions import BotoCoreError, ClientError

        self._location = location
        self._client = client or _make_client(location)
        self._errors = (ClientError, BotoCoreError)

    @property
    def location(self) -> S3Location:
        return self._location

    @property
    def root_uri(self) -> str:
        return self._location.uri

    def _key(self, key: str) -> str:
        return join(self._location.prefix, key)

    def read(self, key: str) -> bytes:
        try:
            response = self._call("get_object", key, Key=self._key(key))
        except _Missing:
            raise NotFound(key) from None
        try:
            body: bytes = response["Body"].read()
        except self._errors as error:  # the connection broke mid-body: as transient as the request
            raise self._translate(error, key) from error
        return body

    def read_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        try:
            response = self._call("get_object", key, Key=self._key(key), Range=f"bytes={start}-{end - 1}")
        except _Missing:
            raise NotFound(key) from None
        except StorageMisconfigured as error:
            if "InvalidRange" in str(error):  # start is at or past the end
                return b""
            raise
        try:
            body: bytes = response["Body"].read()
        except self._errors as error:
            raise self._translate(error, key) from error
        return body

    def write(self, key: str, data: bytes) -> None:
        crash_point(IN_STORAGE_WRITE)
        self._call("put_object", key, Key=self._key(key), Body=data)

    def write_file(self, key: str, path: str) -> None:
        crash_point(IN_STORAGE_WRITE)
        # A multipart upload is invisible until it completes: the key is replaced atomically.
        self._transfer("upload_file", key, path, self._location.bucket, self._key(key))

    def read_file(self, key: str, path: str) -> None:
        try:
            self._transfer("download_file", key, self._location.bucket, self._key(key), path)
        except _Missing:
            raise NotFound(key) from None

    def create(self, key: str, data: bytes) -> bool:
        crash_point(IN_STORAGE_WRITE)
        try:
            self._call("put_object", key, Key=self._key(key), Body=data, IfNoneMatch="*")
            return True
        except _PreconditionFailed:
            return False

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix)
        if prefix.endswith("/") or not prefix:
            full = full + "/" if full else ""
        keys: builtins.list[str] = []
        strip = len(self._location.prefix) + 1 if self._location.prefix else 0
        for page in self._pages(full):
            keys.extend(item["Key"][strip:] for item in page.get("Contents", []))
        return sorted(keys)

    def list_entries(self, folder: str) -> builtins.list[FileEntry]:  # list: the method above
        full = self._key(folder)
        full = full + "/" if full else ""
        strip = len(full)
        return sorted(
            (FileEntry(item["Key"][strip:], int(item["Size"]), int(item["LastModified"].timestamp() * 1000))
             for page in self._pages(full)
             for item in page.get("Contents", [])
             if not item["Key"].endswith("/")),  # Hadoop's directory markers
            key=lambda entry: entry.path,
        )

    def delete(self, key: str) -> None:
        self._call("delete_object", key, Key=self._key(key))

    def delete_prefix(self, prefix: str) -> int:
        # Delete the objects exactly as listed: Hadoop's directory markers end in '/', which
        # re-joining a relative key would drop.
        full = self._key(prefix)
        if prefix.endswith("/") or not prefix:
            full = full + "/" if full else ""
        keys = [item["Key"] for page in self._pages(full) for item in page.get("Contents", [])]
        for start in range(0, len(keys), 1000):
            chunk = [{"Key": key} for key in keys[start : start + 1000]]
            self._call("delete_objects", prefix, Delete={"Objects": chunk, "Quiet": True})
        return len(keys)

    def size(self, prefix: str) -> int:
        full = self._key(prefix)
        return sum(item["Size"] for page in self._pages(full) for item in page.get("Contents", []))

    def spark_uri(self, key: str) -> str:
        return f"s3a://{join(self._location.bucket, self._location.prefix, key)}"

    def check_writable(self) -> None:
        self._call("head_bucket", "")
        probe = join(".probe", "writable")
        self.write(probe, b"")
        self.delete(probe)

    def _pages(self, full_prefix: str) -> Any:
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            yield from paginator.paginate(Bucket=self._location.bucket, Prefix=full_prefix)
        except self._errors as error:
            raise self._translate(error, full_prefix) from error

    def _transfer(self, operation: str, key: str, *args: str) -> None:
        """boto3's managed transfer: large objects in parts, several at once."""
        from boto3.exceptions import S3TransferFailedError, S3UploadFailedError
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(multipart_threshold=_PART_BYTES, multipart_chunksize=_PART_BYTES,
                                max_concurrency=_TRANSFER_THREADS)
        try:
            getattr(self._client, operation)(*args, Config=config)
        except self._errors as error:
            raise self._translate(error, key) from error
        except (S3TransferFailedError, S3UploadFailedError) as error:  # a part failed: transient
            raise StorageUnavailable(f"s3://{join(self._location.bucket, self._key(key))}: {error}") from error

    def _call(self, operation: str, key: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, operation)(Bucket=self._location.bucket, **kwargs)
        except self._errors as error:
            raise self._translate(error, key) from error

    def _translate(self, error: Exception, key: str) -> Exception:
        import botocore.exceptions

        where = f"s3://{join(self._location.bucket, self._key(key))}"
        bucket = self._location.bucket
        if isinstance(error, botocore.exceptions.NoCredentialsError):
            return StorageMisconfigured(
                f"no AWS credentials were found for bucket {bucket}; provide them through the "
                "standard AWS chain (e.g. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from a Secret)"
            )
        if isinstance(error, botocore.exceptions.ClientError):
            code = str(error.response.get("Error", {}).get("Code", ""))
            status = str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in ("NoSuchKey", "404") and key:
                return _Missing(key)
            if code == "PreconditionFailed" or status == "412":
                return _PreconditionFailed(key)
            if code in ("NoSuchBucket",) or (code == "404" and not key):
                return StorageMisconfigured(
                    f"the bucket {bucket} does not exist at {self._endpoint()}; create it or fix the bucket name"
                )
            if code in _CREDENTIAL_ERRORS or status == "403":
                return StorageMisconfigured(
                    f"the credentials were rejected for bucket {bucket} at {self._endpoint()} ({code}); "
                    "check the access key, the secret key and the bucket policy"
                )
            if code in _TRANSIENT_CODES or status.startswith("5"):
                return StorageUnavailable(f"{where}: {code or status}")
            return StorageMisconfigured(f"{where}: {code}: {error.response.get('Error', {}).get('Message', '')}")
        return StorageUnavailable(f"{where}: {error}")

    def _endpoint(self) -> str:
        return self._location.endpoint_url or "AWS S3"


class _Missing(NotFound):
    pass


class _PreconditionFailed(StorageError):
    pass


_clients: dict[tuple[Any, ...], Any] = {}
_clients_lock = threading.Lock()


def _forget_clients() -> None:
    _clients.clear()


# A child process must not share its parent's connections.
os.register_at_fork(after_in_child=_forget_clients)


def _make_client(location: S3Location, **credentials: Any) -> Any:
    """One client per endpoint, region, addressing style and credentials in a process.
    boto3's clients are thread-safe; each new one cost 0.07 to 0.17 s (its session loads
    the S3 service model) and opened connections of its own, and a driver resuming on S3
    made three before its first batch. A client that found no credentials is not kept, so
    that credentials provided later are found."""
    key = (location.endpoint_url, location.region, location.path_style, tuple(sorted(credentials.items())))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client, has_credentials = _new_client(location, **credentials)
            if has_credentials:
                _clients[key] = client
        return client


def _new_client(location: S3Location, **credentials: Any) -> tuple[Any, bool]:
    import boto3.session
    import botocore.config

    config = botocore.config.Config(
        region_name=location.region,
        s3={"addressing_style": "path" if location.path_style else "auto"},
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=5,
        read_timeout=30,
        max_pool_connections=_CONNECTIONS,
    )
    session = boto3.session.Session(**credentials)
    found = session.get_credentials() is not None
    return session.client("s3", endpoint_url=location.endpoint_url, config=config), found


def client_with_keys(location: S3Location, access_key_id: str, secret_access_key: str,
                     session_token: str | None) -> Any:
    """A client with credentials of its own (a shared table reached with the reader's own
    Secret) rather than the standard chain; the caller passes it to ``S3Storage``."""
    return _make_client(location, aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
                        aws_session_token=session_token)
