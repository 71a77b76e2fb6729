"""Shared tables through the resource, on the local control plane: a reader created
before its publisher waits Pending (WaitingForTable) and starts by itself once the table
has a version; it backfills the table, started paused and steered through the resource
(rowsPerSecond 0, then a rate, then unlimited) without a restart; its output equals a
plain computation; the publisher's status, kubectl get -o wide and the metrics show the
table and its holder; deleting the reader releases its hold at once; a reader in a
namespace the publisher does not grant waits, saying so."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from ppl_cluster import (
    DRIVER_RBAC,
    GROUP,
    PLURAL,
    RESTRICTED,
    VERSION,
    Namespace,
    Operator,
    claim,
    eventually,
    wordcount,
)

from demo.shared_tables import ORDERS_HEADER, expected_customers, expected_tiers, orders
from localcluster.testing import wait_for
from spark_app.state.tables import HoldRegistry
from spark_app.storage import FilesystemStorage
from tests.integration.spark_app.harness import fold, read_changelog, write_csv

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

PUBLISHER = "orders-enriched"


def publisher(readers: list[str] | None = None) -> dict[str, Any]:
    return wordcount(PUBLISHER, application={
        "file": "examples/shared_publisher.py",
        "args": ["--orders", "/data/orders", "--trigger-interval-ms", "500", "--compact-every-s", "5",
                 "--compaction-margin-s", "0"],
    }, tables=[{"name": "customers", **({"readers": readers} if readers else {})}])


def tiers(namespace: str, rows_per_second: int | None = 0) -> dict[str, Any]:
    """The reader, backfilling at most two rows a chunk at ``rows_per_second`` (0: paused)."""
    return wordcount("tiers", application={
        "file": "examples/shared_tiers.py",
        "args": ["--output", "/data/tiers.jsonlines", "--trigger-interval-ms", "500", "--backfill",
                 "--chunk-rows", "2"],
    }, inputs=tiers_inputs(namespace, rows_per_second))


def tiers_inputs(namespace: str, rows_per_second: int | None) -> list[dict[str, Any]]:
    return [{"persistentId": "customers", "table": {"pipeline": PUBLISHER, "name": "customers", "namespace": namespace},
             "backfill": {"rowsPerSecond": rows_per_second}}]


def backfill(ns: Namespace) -> dict[str, Any]:
    return dict((ns.status("tiers").get("backfills") or {}).get("customers") or {})


def progressing(ns: Namespace, name: str) -> dict[str, Any]:
    return next((c for c in ns.status(name).get("conditions") or [] if c["type"] == "Progressing"), {})


def holds(ns: Namespace) -> list[str]:
    table = ns.folder("state") / ns.name / PUBLISHER / "tables" / "customers"
    return sorted(str(h.reader) for h in HoldRegistry(FilesystemStorage(str(table))).holds())


@pytest.fixture
def other_ns(ns: Namespace, api: client.ApiClient) -> Iterator[Namespace]:
    """A second namespace, for a reader the publisher has not granted."""
    name = f"ppl-other-{uuid.uuid4().hex[:5]}"
    other = Namespace(name, ns.cluster, api)
    other.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=RESTRICTED)))
    wait_for("the default service account", lambda: other.core.list_namespaced_service_account(name).items)
    other.apply(*DRIVER_RBAC, claim("state"), claim("data"))
    yield other
    for item in other.custom.list_namespaced_custom_object(GROUP, VERSION, name, PLURAL)["items"]:
        other.custom.patch_namespaced_custom_object(GROUP, VERSION, name, PLURAL, item["metadata"]["name"],
                                                    {"metadata": {"finalizers": None}})
    other.core.delete_namespace(name)


def test_a_reader_waits_for_its_table_starts_by_itself_and_releases_its_hold_when_deleted(
        ns: Namespace, operator: Operator, other_ns: Namespace, tmp_path: Path) -> None:
    ns.apply(tiers(ns.name))
    eventually("the reader waiting for its table",
               lambda: progressing(ns, "tiers").get("reason") == "WaitingForTable", timeout=60)
    assert ns.status("tiers")["phase"] == "Pending"
    assert f"{ns.name}/{PUBLISHER}/customers" in progressing(ns, "tiers")["message"]
    assert "does not exist" in progressing(ns, "tiers")["message"]
    ns.announced("tiers", "WaitingForTable")
    assert ns.driver("tiers", running=False) is None

    for f in range(3):
        write_csv(ns.folder("data") / "orders", f"part-{f:04d}.csv", ORDERS_HEADER, orders(f))
    ns.apply(publisher())
    eventually("the reader started by itself", lambda: ns.driver("tiers") is not None, timeout=240)

    # Paused: nothing of the table is read, though its rows are counted as they come; then
    # a row a second, then unlimited, each set on the resource and delivered to the driver.
    eventually("a paused backfill in the status, counting the table's rows", lambda: backfill(ns).get("paused")
               and backfill(ns).get("rowsTotal", 0) >= len(expected_customers(range(1))), timeout=240)
    assert backfill(ns)["rowsRead"] == 0, backfill(ns)
    ns.patch("tiers", {"inputs": tiers_inputs(ns.name, 1)})
    eventually("rows read at a row a second",
               lambda: 0 < backfill(ns).get("rowsRead", 0) < backfill(ns)["rowsTotal"], timeout=90)
    wide = ns.kubectl("get", "persistentpipeline", "tiers", "-o", "wide")
    assert "BACKFILL" in wide and "%" in wide, wide
    ns.patch("tiers", {"inputs": tiers_inputs(ns.name, None)})
    eventually("the backfill finished", lambda: backfill(ns).get("finished"), timeout=120)
    reasons = ns.announced("tiers", "BackfillStarted", "BackfillResumed", "BackfillFinished")
    assert reasons.count("LiveSettingsChanged") == 2, reasons
    assert ns.driver("tiers", epoch=1) is not None, "the rate changes restarted the reader"

    def folded() -> dict[Any, Any]:
        tiers_out = fold(read_changelog(ns.folder("data") / "tiers.jsonlines"), ("tier",))
        return {k: v for k, v in tiers_out.items() if v["customers"]}

    eventually("the tiers of all orders", lambda: folded() == expected_tiers(range(3)), timeout=300)
    reader = f"{ns.name}/tiers/customers"
    eventually("the holder in the publisher's status", lambda: reader in [
        h["reader"] for h in ((ns.status(PUBLISHER).get("tables") or {}).get("customers") or {}).get("holders", [])],
        timeout=120)
    wide = ns.kubectl("get", "persistentpipeline", PUBLISHER, "-o", "wide")
    assert "TABLES" in wide and "customers v" in wide, wide
    assert f'persistent_pipeline_table_version{{namespace="{ns.name}",pipeline="{PUBLISHER}",table="customers"}}' \
        in operator.metrics()

    # Another namespace, not granted: Pending, saying so (its own operator serves it).
    other_operator = Operator(other_ns.cluster, other_ns.name, tmp_path / "other")
    (tmp_path / "other").mkdir()
    other_operator.start()
    try:
        other_ns.apply(tiers(ns.name))
        eventually("the other namespace's reader waiting", lambda: "does not grant namespace" in progressing(
            other_ns, "tiers").get("message", ""), timeout=60)
        assert other_ns.status("tiers")["phase"] == "Pending"
    finally:
        other_operator.stop()

    assert reader in holds(ns)
    ns.delete("tiers")
    eventually("the reader gone", lambda: ns.pipeline("tiers") is None, timeout=180)
    assert reader not in holds(ns), "the deleted reader's hold is still there"
