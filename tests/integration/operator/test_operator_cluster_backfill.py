"""A backfill steered through the resource while its driver runs, on the local control
plane: started paused (rowsPerSecond 0), let go at a rate, paused again, then unlimited
to the end; the driver is never restarted, the status and kubectl get -o wide follow,
Events mark each turn, and the output, folded, is the table."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ppl_cluster import Namespace, Operator, eventually, wordcount

from spark_app import contract
from tests.integration.spark_app.delta_writer import Writer
from tests.integration.spark_app.harness import fold, read_changelog

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

ROWS = 3000
UNUSED_ENDPOINT = "http://127.0.0.1:9"


@pytest.fixture
def table(ns: Namespace, tmp_path: Path) -> Iterator[Path]:
    """A Delta table of ROWS rows (id, value = 10 * id) with its change data feed, on the data claim."""
    path = ns.folder("data") / "accounts"
    writer = Writer(UNUSED_ENDPOINT, {"spark.sql.shuffle.partitions": "1"}, tmp_path / "writer.log")
    try:
        assert writer.answer(240) == "ready"
        writer.call(f"create {path} {ROWS}", timeout=240)
    finally:
        writer.stop()
    yield path


def reader(rows_per_second: int | None) -> dict[str, Any]:
    return wordcount("reader", application={
        "file": "examples/table_backfill.py",
        "args": ["--table", "/data/accounts", "--output", "/data/accounts.jsonlines", "--chunk-rows", "100",
                 "--trigger-interval-ms", "500"],
    }, inputs=[{"persistentId": "accounts", "backfill": {"rowsPerSecond": rows_per_second}}])


def backfill(ns: Namespace) -> dict[str, Any]:
    return dict((ns.status("reader").get("backfills") or {}).get("accounts") or {})


def reported(ns: Namespace) -> dict[str, Any]:
    """The backfill as the driver last reported it, on its pod."""
    pod = ns.driver("reader", epoch=1)
    assert pod is not None, "the reader's driver is not running"
    return dict(json.loads(pod.metadata.annotations[contract.STATUS_ANNOTATION])["backfills"]["accounts"])


def settled(read: Callable[[], int], quiet_s: float, timeout: float) -> int:
    """The value ``read`` gives once it has not changed for ``quiet_s``."""
    deadline = time.monotonic() + timeout
    value, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(1)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return value
    raise TimeoutError(f"the value kept changing for {timeout:.0f}s (last: {value})")


def folded(changelog: Path) -> dict[int, tuple[int, int]]:
    return {k[0]: (row["n"], row["value"]) for k, row in fold(read_changelog(changelog), ("id",)).items()}


def test_the_backfill_rate_follows_the_resource_without_a_restart(ns: Namespace, operator: Operator,
                                                                  table: Path) -> None:
    ns.apply(reader(rows_per_second=0))
    eventually("a paused backfill in the status", lambda: backfill(ns).get("paused"), timeout=240)
    time.sleep(3)
    assert backfill(ns)["rowsRead"] == 0 and backfill(ns)["rowsTotal"] == ROWS
    ns.announced("reader", "BackfillStarted")
    started = [message for _, reason, message in ns.events("reader") if reason == "BackfillStarted"]
    assert started and f"{ROWS} rows in the table at version" in started[0] and "None" not in started[0], started

    ns.patch("reader", {"inputs": [{"persistentId": "accounts", "backfill": {"rowsPerSecond": 100}}]})
    eventually("the backfill resumed", lambda: "BackfillResumed" in ns.event_reasons("reader"), timeout=60)
    eventually("rows read at 100 rows/s", lambda: backfill(ns).get("rowsRead", 0) >= 300, timeout=60)

    ns.patch("reader", {"inputs": [{"persistentId": "accounts", "backfill": {"rowsPerSecond": 0}}]})
    eventually("paused again", lambda: backfill(ns).get("paused"), timeout=60)
    # A chunk being read when the pause arrives is finished: the count settles, then stays
    # (at 100 rows/s an unpaused backfill would never hold still for 8 s before reading all
    # 3,000 rows). Read from the driver's own report on its pod: the status follows it when
    # the operator gets to it, which under two test workers once took over 8 s (the status
    # settled at 350 while the driver had reported 450 at once, and then said 450).
    held = settled(lambda: reported(ns)["rows_read"], quiet_s=8, timeout=90)
    assert 0 < held < ROWS, "a paused backfill read on"
    time.sleep(6)
    assert reported(ns)["rows_read"] == held, "a paused backfill read on"
    eventually("the status at the driver's count", lambda: backfill(ns)["rowsRead"] == held, timeout=60)
    wide = ns.kubectl("get", "persistentpipeline", "reader", "-o", "wide")
    assert "BACKFILL" in wide and "paused at" in wide, wide

    ns.patch("reader", {"inputs": [{"persistentId": "accounts", "backfill": {"rowsPerSecond": None}}]})
    eventually("finished", lambda: backfill(ns).get("finished"), timeout=120)
    assert ns.status("reader")["backfill"] == "done" and backfill(ns)["rowsTotal"] == ROWS
    reasons = ns.announced("reader", "BackfillFinished")
    assert reasons.count("BackfillPaused") == 1, reasons
    assert reasons.count("LiveSettingsChanged") == 3
    assert ns.driver("reader", epoch=1) is not None, "the rate changes restarted the driver"
    expected = {i: (1, i * 10) for i in range(ROWS)}
    eventually("the output is the table", lambda: folded(ns.folder("data") / "accounts.jsonlines") == expected,
               timeout=60)
