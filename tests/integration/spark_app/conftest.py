from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.spark_app.harness import PIPELINES, Driver


@dataclass
class Workspace:
    """Folders for one pipeline under test, and a way to start its drivers."""

    root: Path
    state: str
    endpoint_url: str | None = None

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    @property
    def out(self) -> Path:
        return self.root / "out"

    def driver(
        self, *extra: str, pipeline: str = "two_outputs.py", env: dict[str, str] | None = None
    ) -> Driver:
        args = [
            str(PIPELINES / pipeline),
            "--input",
            str(self.inputs),
            "--out-dir",
            str(self.out),
            "--state",
            self.state,
            *extra,
        ]
        if self.endpoint_url:
            args += ["--endpoint-url", self.endpoint_url]
        runs = len(list(self.root.glob("driver-*.log")))
        return Driver(args, self.root / f"driver-{runs}.log", env or {})


@pytest.fixture(params=["filesystem", "s3"])
def workspace(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Workspace]:
    """A workspace per storage backend: the behavioural suite runs against both."""
    if request.param == "filesystem":
        yield Workspace(tmp_path, str(tmp_path / "state"))
    else:
        server = request.getfixturevalue("s3_server")
        yield Workspace(tmp_path, f"s3://{server.new_bucket()}/pipelines/two", server.endpoint_url)


@pytest.fixture
def fs_workspace(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path, str(tmp_path / "state"))
