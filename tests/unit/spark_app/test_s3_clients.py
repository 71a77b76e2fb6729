"""A process keeps one boto3 client per endpoint, region, addressing style and credentials
(spark_app.storage.s3): building one costs a tenth of a second, and a resuming driver built
three. Building a client makes no request, so these need no server."""

from __future__ import annotations

import os

import pytest

from spark_app.persistence import Backend
from spark_app.storage import s3
from spark_app.storage.s3 import S3Location, S3Storage, client_with_keys

ENDPOINT = "http://127.0.0.1:9"


@pytest.fixture(autouse=True)
def _fresh_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3, "_clients", {}, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unit")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "unit-secret")


def location(prefix: str, endpoint: str = ENDPOINT) -> S3Location:
    return S3Location("bucket", prefix, endpoint, "us-east-1", path_style=True)


def test_storages_of_one_endpoint_share_a_client() -> None:
    metadata, snapshots = S3Storage(location("state/metadata")), S3Storage(location("state/snapshots"))
    assert metadata._client is snapshots._client


def test_backends_below_one_root_share_a_client() -> None:
    root = Backend.from_uri("s3://bucket/state", endpoint_url=ENDPOINT)
    first, second = root.child("a").storage(), root.child("b").storage()
    assert first.inner._client is second.inner._client  # type: ignore[attr-defined]


def test_another_endpoint_or_addressing_gets_its_own_client() -> None:
    one = S3Storage(location("p"))._client
    assert S3Storage(location("p", "http://127.0.0.1:10"))._client is not one
    assert S3Storage(S3Location("bucket", "p", ENDPOINT, "us-east-1", path_style=False))._client is not one
    assert S3Storage(S3Location("bucket", "p", ENDPOINT, "eu-west-1", path_style=True))._client is not one


def test_keys_of_its_own_get_a_client_of_their_own() -> None:
    chain = S3Storage(location("p"))._client
    table = client_with_keys(location("t"), "table-key", "table-secret", None)
    assert table is not chain
    assert client_with_keys(location("u"), "table-key", "table-secret", None) is table
    assert client_with_keys(location("t"), "other-key", "other-secret", None) is not table


def test_a_client_without_credentials_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    first = S3Storage(location("p"))._client
    # Credentials that turn up later are found by the next storage.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "late")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "late-secret")
    later = S3Storage(location("p"))._client
    assert later is not first
    assert later.meta.region_name == "us-east-1" and later._request_signer._credentials.access_key == "late"


def test_a_forked_child_builds_its_own_client() -> None:
    parent = S3Storage(location("p"))._client
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its parent's clients (and their connections) are gone
        os.close(read)
        os.write(write, b"1" if not s3._clients and S3Storage(location("p"))._client is not parent else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1"


def test_the_shared_client_holds_a_connection_for_each_concurrent_user() -> None:
    from spark_app.state.file_index import _READS_AT_ONCE

    client = S3Storage(location("p"))._client
    # A file index's reads, two outputs' snapshots in parts, the lease and the commit at once.
    assert client.meta.config.max_pool_connections >= _READS_AT_ONCE + 2 * s3._TRANSFER_THREADS + 2
