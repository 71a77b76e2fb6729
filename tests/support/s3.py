"""A real S3 API server (moto's) on loopback for the tests, with throwaway credentials."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import boto3
import pytest
from moto.server import ThreadedMotoServer

TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing-access-key",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str

    def client(self):  # type: ignore[no-untyped-def]
        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1")

    def new_bucket(self) -> str:
        name = f"test-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """Starts moto's S3 server on 127.0.0.1 (a free port) for the whole session."""
    saved = {k: os.environ.get(k) for k in TEST_CREDENTIALS}
    os.environ.update(TEST_CREDENTIALS)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield S3Server(f"http://{host}:{port}")
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
