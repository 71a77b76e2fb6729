from __future__ import annotations

from collections.abc import Iterator

import pytest

from spark_app.persistence import Backend
from spark_app.storage import Storage
from tests.support.s3 import S3Server, s3_server  # noqa: F401 - a fixture


@pytest.fixture(params=["filesystem", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path) -> Iterator[Backend]:  # type: ignore[no-untyped-def]
    """Each test using this runs once per storage backend: the shared contract suite."""
    if request.param == "filesystem":
        yield Backend.filesystem(tmp_path / "state")
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        yield Backend.s3(f"s3://{server.new_bucket()}/pipelines/p1", endpoint_url=server.endpoint_url)


@pytest.fixture
def storage(backend: Backend) -> Storage:
    return backend.storage()
