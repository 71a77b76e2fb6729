from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.spark_app.harness import PIPELINES, Driver


@dataclass
class Workspace:
    """Folders for one pipeline under test, and a way to start its drivers."""

    root: Path
    state: str
    endpoint_url: str | None = None
    started: list[Driver] = field(default_factory=list)

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
        driver = Driver(args, self.root / f"driver-{runs}.log", env or {})
        self.started.append(driver)
        return driver

    def kill_all(self) -> None:
        """No driver outlives its test, whatever the test's outcome."""
        for driver in self.started:
            if driver.process is not None:
                driver.kill()


@pytest.fixture(params=["filesystem", "s3"])
def workspace(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Workspace]:
    """A workspace per storage backend: the behavioural suite runs against both."""
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
