from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.spark_app.harness import Workspace, open_backend_workspace
from tests.integration.spark_app.shared import SharedWorkspace, open_workspace


# make test resumes on S3 in the chaos rounds (killed at a fault point, a frozen stale
# driver, a shared table's publisher and readers), outputs compared exactly.
@pytest.fixture(params=["filesystem", pytest.param("s3", marks=pytest.mark.long)])
def workspace(request: pytest.FixtureRequest, tmp_path: Path) -> Workspace:
    """A workspace per storage backend: the behavioural suite runs against both (make
    test-long, make test-chaos)."""
    return open_backend_workspace(request, tmp_path, request.param)


@pytest.fixture
def fs_workspace(tmp_path: Path) -> Iterator[Workspace]:
    workspace = Workspace(tmp_path, str(tmp_path / "state"))
    yield workspace
    workspace.kill_all()


@pytest.fixture(params=["filesystem", "s3"] if "CHAOS_ROUNDS" in os.environ else ["filesystem"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SharedWorkspace]:
    """A shared-table workspace on the filesystem; on S3 as well under make test-chaos."""
    workspace = open_workspace(request, tmp_path, request.param)
    yield workspace
    workspace.kill_all()


@pytest.fixture
def fs_shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SharedWorkspace]:
    workspace = open_workspace(request, tmp_path, "filesystem")
    yield workspace
    workspace.kill_all()
