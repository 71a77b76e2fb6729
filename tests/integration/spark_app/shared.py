"""The shared-table examples under test (examples/shared_*.py): their input, what their
outputs hold once they have read it, and a workspace that starts their drivers."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration.spark_app.harness import Driver, fold, multiset, read_changelog, write_csv

REPO = Path(__file__).resolve().parents[3]
ORDERS_HEADER = "order_id,customer_id,region,amount,kind"
CLICKS_HEADER = "click_id,customer_id,page"
REGULARS = [f"c{i:02d}" for i in range(12)]
"""Customers from the first orders file on, never deleted: the clicks are theirs."""
REGIONS = ("eu", "us", "ap")


def region(customer: str) -> str:
    return REGIONS[sum(map(ord, customer)) % len(REGIONS)]


def orders(file_number: int) -> list[str]:
    """File 0 opens every regular customer; each later file orders for five of them, and
    opens a one-off customer whose order the next file cancels (a key that is inserted,
    then deleted)."""
    if file_number == 0:
        return [f"o0-{c},{c},{region(c)},{100 * (i + 1)},order" for i, c in enumerate(REGULARS)]
    rows = [f"o{file_number}-{i},{c},{region(c)},{150 * (file_number + i)},order"
            for i, c in enumerate(REGULARS[(file_number * 5 + k) % len(REGULARS)] for k in range(5))]
    once = f"x{file_number:03d}"
    rows.append(f"o{file_number}-x,{once},{region(once)},777,order")
    if file_number > 1:
        before = f"x{file_number - 1:03d}"
        rows.append(f"o{file_number}-cancel,{before},{region(before)},-777,cancel")
    return rows


def clicks(file_number: int) -> list[str]:
    return [f"k{file_number}-{i},{REGULARS[(file_number + i * 5) % len(REGULARS)]},page{i}" for i in range(4)] + [
        f"k{file_number}-none,nobody,home"]


def expected_customers(files: range) -> dict[tuple[Any, ...], dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for row in (r for f in files for r in orders(f)):
        _, customer, where, amount, kind = row.split(",")
        current = table.setdefault(customer, {"customer_id": customer, "region": where, "open_orders": 0, "total": 0})
        current["open_orders"] += -1 if kind == "cancel" else 1
        current["total"] += int(amount)
        current["region"] = max(current["region"], where)
    return {(c,): row for c, row in table.items() if row["open_orders"] != 0}


def tier(total: int) -> str:
    return "gold" if total >= 10_000 else "silver" if total >= 2_000 else "bronze"


def expected_tiers(files: range) -> dict[tuple[Any, ...], dict[str, Any]]:
    tiers: dict[str, dict[str, Any]] = {}
    for row in expected_customers(files).values():
        current = tiers.setdefault(tier(row["total"]), {"tier": tier(row["total"]), "customers": 0, "revenue": 0})
        current["customers"] += 1
        current["revenue"] += row["total"]
    return {(t,): row for t, row in tiers.items()}


def expected_clicks(files: range) -> Counter[str]:
    return Counter(
        json.dumps({"customer_id": c, "click_id": k, "page": p, "region": region(c) if c in REGULARS else None},
                   sort_keys=True)
        for f in files for k, c, p in (line.split(",") for line in clicks(f)))


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


def table_storage(workspace: SharedWorkspace) -> Any:
    from spark_app.persistence import Backend

    return Backend.from_uri(f"{workspace.publisher_state}/tables/customers",
                            endpoint_url=workspace.endpoint_url).storage()
