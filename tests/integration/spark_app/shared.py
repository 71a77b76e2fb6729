"""A workspace that starts the shared-table examples' drivers (examples/shared_*.py) and
checks their outputs against demo.shared_tables (their input, and what it folds to)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from demo.shared_tables import (
    CLICKS_HEADER,
    ORDERS_HEADER,
    clicks,
    expected_clicks,
    expected_customers,
    expected_tiers,
    orders,
)
from tests.integration.spark_app.harness import Driver, fold, multiset, read_changelog, write_csv

if TYPE_CHECKING:
    import pytest

REPO = Path(__file__).resolve().parents[3]


@dataclass
class SharedWorkspace:
    """The publisher and its two readers, each with its own state under ``state``."""

    root: Path
    state: str
    """A folder or s3://bucket/prefix holding each pipeline's state root."""
    endpoint_url: str | None = None
    started: list[Driver] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)

    @property
    def publisher_state(self) -> str:
        return f"{self.state}/publisher"

    def driver(self, name: str, example: str, *args: str, env: dict[str, str] | None = None) -> Driver:
        """A driver of ``example`` with the next epoch of ``name`` (as the operator's relaunches)."""
        self.epochs[name] = self.epochs.get(name, 0) + 1
        extra = ["--endpoint-url", self.endpoint_url] if self.endpoint_url else []
        environment = {"SPARK_APP_EPOCH": str(self.epochs[name]), **(env or {})}
        if self.endpoint_url:
            environment["SPARK_APP_S3_ENDPOINT"] = self.endpoint_url  # how the table's location is reached
        driver = Driver([str(REPO / "examples" / example), "--state", f"{self.state}/{name}",
                         "--trigger-interval-ms", "300", *extra, *args],
                        self.root / f"{name}-{self.epochs[name]}.log", environment)
        self.started.append(driver)
        return driver

    def publisher(self, *args: str, env: dict[str, str] | None = None) -> Driver:
        return self.driver("publisher", "shared_publisher.py", "--orders", str(self.root / "orders"), *args,
                           env=env)

    def tiers(self, *args: str, name: str = "tiers", env: dict[str, str] | None = None) -> Driver:
        return self.driver(name, "shared_tiers.py", "--publisher-state", self.publisher_state,
                           "--output", str(self.root / f"{name}.jsonlines"),
                           "--changes", str(self.root / f"{name}-changes.jsonlines"), *args, env=env)

    def clicks(self, *args: str, env: dict[str, str] | None = None) -> Driver:
        return self.driver("clicks", "shared_clicks.py", "--publisher-state", self.publisher_state,
                           "--clicks", str(self.root / "clicks"), "--output", str(self.root / "clicks.jsonlines"),
                           *args, env=env)

    def add_orders(self, file_number: int) -> None:
        write_csv(self.root / "orders", f"part-{file_number:04d}.csv", ORDERS_HEADER, orders(file_number))

    def add_clicks(self, file_number: int) -> None:
        write_csv(self.root / "clicks", f"part-{file_number:04d}.csv", CLICKS_HEADER, clicks(file_number))

    def check_tiers(self, files: range, name: str = "tiers") -> None:
        """The reader's changelog folds into the table, and its tiers into the tiers of
        a plain computation over all orders (a tier left empty keeps a row of zeros)."""
        changes = fold(read_changelog(self.root / f"{name}-changes.jsonlines"), ("customer_id",))
        assert changes == expected_customers(files)
        tiers = fold(read_changelog(self.root / f"{name}.jsonlines"), ("tier",))
        assert {k: v for k, v in tiers.items() if v["customers"]} == expected_tiers(files)

    def check_clicks(self, files: range) -> None:
        assert multiset(read_changelog(self.root / "clicks.jsonlines")) == expected_clicks(files)

    def kill_all(self) -> None:
        for driver in self.started:
            if driver.process is not None:
                driver.kill()


def open_workspace(request: pytest.FixtureRequest, tmp_path: Path, backend: str) -> SharedWorkspace:
    """A workspace whose state is on ``backend``: a folder, or a new bucket of the test S3 server."""
    if backend == "filesystem":
        return SharedWorkspace(tmp_path, str(tmp_path / "state"))
    server = request.getfixturevalue("s3_server")
    return SharedWorkspace(tmp_path, f"s3://{server.new_bucket()}/pipelines", server.endpoint_url)


def table_storage(workspace: SharedWorkspace) -> Any:
    from spark_app.persistence import Backend

    return Backend.from_uri(f"{workspace.publisher_state}/tables/customers",
                            endpoint_url=workspace.endpoint_url).storage()


def run(driver: Driver, timeout: float = 300) -> None:
    """Starts the driver and waits for it to end, which it must do cleanly."""
    code = driver.start().wait(timeout)
    assert code == 0, driver.output()[-4000:]
