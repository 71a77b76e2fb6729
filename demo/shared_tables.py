"""The shared-table examples' input (examples/shared_*.py): orders and clicks as CSV rows,
and what the readers' outputs hold once they have read them, computed in plain Python.
The demo's shared-table chapter and the Spark tests feed and check the same files."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from demo.story import ChangelogError, fold

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


def expected_customers(files: Iterable[int]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return customers_of(r for f in files for r in orders(f))


def customers_of(order_rows: Iterable[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The publisher's table after these order lines, as a plain fold."""
    table: dict[str, dict[str, Any]] = {}
    for row in order_rows:
        _, customer, where, amount, kind = row.split(",")
        current = table.setdefault(customer, {"customer_id": customer, "region": where, "open_orders": 0, "total": 0})
        current["open_orders"] += -1 if kind == "cancel" else 1
        current["total"] += int(amount)
        current["region"] = max(current["region"], where)
    return {(c,): row for c, row in table.items() if row["open_orders"] != 0}


def tier(total: int) -> str:
    return "gold" if total >= 10_000 else "silver" if total >= 2_000 else "bronze"


def expected_tiers(files: Iterable[int]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return tiers_of(expected_customers(files))


def tiers_of(customers: dict[tuple[Any, ...], dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    tiers: dict[str, dict[str, Any]] = {}
    for row in customers.values():
        current = tiers.setdefault(tier(row["total"]), {"tier": tier(row["total"]), "customers": 0, "revenue": 0})
        current["customers"] += 1
        current["revenue"] += row["total"]
    return {(t,): row for t, row in tiers.items()}


def expected_clicks(files: Iterable[int]) -> Counter[str]:
    return Counter(
        json.dumps({"customer_id": c, "click_id": k, "page": p, "region": region(c) if c in REGULARS else None},
                   sort_keys=True)
        for f in files for k, c, p in (line.split(",") for line in clicks(f)))


# ---- as files, and read back ------------------------------------------------------------------


def orders_csv(file_number: int) -> str:
    return _csv(ORDERS_HEADER, orders(file_number))


def clicks_csv(file_number: int) -> str:
    return _csv(CLICKS_HEADER, clicks(file_number))


def _csv(header: str, rows: list[str]) -> str:
    return header + "\n" + "".join(f"{row}\n" for row in rows)


def folded_customers(changelog: str | None) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The table's changes as the tiers reader wrote them, folded (see story.fold)."""
    return {(k,): row for k, row in fold(changelog, "customer_id").items()}


def folded_tiers(changelog: str | None) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The tiers with customers (a tier left empty keeps a row of zeros)."""
    return {(k,): row for k, row in fold(changelog, "tier").items() if row["customers"]}


def clicks_multiset(changelog: str | None) -> Counter[str]:
    """The enriched clicks, an append-only output, as a multiset of rows."""
    rows = [json.loads(line) for line in (changelog or "").splitlines() if line.strip()]
    if any(row["diff"] != 1 for row in rows):
        raise ChangelogError("the enriched clicks retract a row, but the output is append-only")
    return Counter(json.dumps({k: v for k, v in row.items() if k not in ("time", "diff")}, sort_keys=True)
                   for row in rows)
