from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.spark_app.harness import Workspace


# make test resumes on S3 in the chaos rounds (killed at a fault point, a frozen stale
# driver, a shared table's publisher and readers), outputs compared exactly.
@pytest.fixture(params=["filesystem", pytest.param("s3", marks=pytest.mark.long)])
def workspace(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Workspace]:
    """A workspace per storage backend: the behavioural suite runs against both (make
    test-long, make test-chaos)."""
    if request.param == "filesystem":
        workspace = Workspace(tmp_path, str(tmp_path / "state"))
    else:
        server = request.getfixturevalue("s3_server")
        workspace = Workspace(tmp_path, f"s3://{server.new_bucket()}/pipelines/two", server.endpoint_url)
    yield workspace
    workspace.kill_all()


@pytest.fixture
def fs_workspace(tmp_path: Path) -> Iterator[Workspace]:
    workspace = Workspace(tmp_path, str(tmp_path / "state"))
    yield workspace
    workspace.kill_all()
