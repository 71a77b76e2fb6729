"""A keyed Delta table read from its start while it keeps changing: inserts, updates and
deletes land before and after the backfill's position, the reader is killed at random
moments, and its output, folded, is exactly the table at the end; the backfill's rate
is changed while the reader runs (paused, then let go) through the live settings file.

`make test` runs one round on S3, six changes and two kills; `make test-chaos` runs
CHAOS_ROUNDS on each backend, ten changes and three kills or more each.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.spark_app.delta_writer import Writer
from tests.integration.spark_app.harness import Workspace, fold, read_changelog, wait_until_passes

pytestmark = pytest.mark.spark

ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "1"))
# make test's round is on S3, where the table's bucket is reached through the settings of
# the driver's environment (the other backfill tests read a table in a folder).
CASES = ([(seed, backend) for seed in range(ROUNDS) for backend in ("filesystem", "s3")]
         if "CHAOS_ROUNDS" in os.environ else [(0, "s3")])
ROWS = 2000
MIN_KILLS = 3 if "CHAOS_ROUNDS" in os.environ else 2
CHANGES = 10 if "CHAOS_ROUNDS" in os.environ else 6
UNUSED_ENDPOINT = "http://127.0.0.1:9"


class Table:
    """The upstream Delta table, written by a process of its own, and what it should hold."""

    def __init__(self, writer: Writer, uri: str, rows: int) -> None:
        self.writer, self.uri = writer, uri
        self.rows = {i: i * 10 for i in range(rows)}
        writer.call(f"create {uri} {rows}", timeout=240)

    def change(self, upsert: dict[int, int], delete: set[int]) -> None:
        body = {"upsert": sorted(upsert.items()), "delete": sorted(delete - set(upsert))}
        self.writer.call(f"merge {self.uri} {json.dumps(body, separators=(',', ':'))}")
        for key in body["delete"]:
            self.rows.pop(key, None)
        self.rows.update(upsert)

    def random_change(self, chance: random.Random) -> None:
        live = sorted(self.rows)
        upsert = {k: chance.randrange(10**6) for k in chance.sample(live, 15)}
        upsert.update({chance.randrange(ROWS, 2 * ROWS): chance.randrange(10**6) for _ in range(5)})
        self.change(upsert, set(chance.sample(live, 8)))


def assert_output_is_the_table(workspace: Workspace, table: Table) -> None:
    folded = fold(read_changelog(workspace.out / "accounts.jsonlines"), ("id",))
    got = {k[0]: (row["n"], row["value"]) for k, row in folded.items()}
    wrong = {k: (got.get(k), (1, v)) for k, v in table.rows.items() if got.get(k) != (1, v)}
    assert not wrong, f"{len(wrong)} ids differ from the table (got, expected), e.g. {list(wrong.items())[:5]}"
    ghosts = {k: v for k, v in got.items() if k not in table.rows and v != (0, 0)}
    assert not ghosts, f"deleted ids still counted: {list(ghosts.items())[:5]}"


@pytest.fixture
def setting(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Workspace, Writer, str, dict[str, str]]]:
    """A workspace, a table writer and where the table lives, on one backend."""
    backend = request.node.callspec.params["case"][1] if hasattr(request.node, "callspec") else "filesystem"
    if backend == "filesystem":
        workspace = Workspace(tmp_path, str(tmp_path / "state"))
        endpoint, uri, env = UNUSED_ENDPOINT, str(tmp_path / "table"), {}
    else:
        server = request.getfixturevalue("s3_server")
        bucket = server.new_bucket()
        workspace = Workspace(tmp_path, f"s3://{bucket}/state", server.endpoint_url)
        endpoint, uri = server.endpoint_url, f"s3a://{bucket}/table"
        env = {"SPARK_APP_S3_ENDPOINT": server.endpoint_url}
    writer = Writer(endpoint, {"spark.sql.shuffle.partitions": "2"}, tmp_path / "writer.log")
    try:
        assert writer.answer(240) == "ready"
        yield workspace, writer, uri, env
    finally:
        writer.stop()
        workspace.kill_all()


@pytest.mark.parametrize("case", CASES, ids=[f"{b}-{s}" for s, b in CASES])
def test_a_reader_killed_during_its_backfill_ends_with_exactly_the_table(
        setting: tuple[Workspace, Writer, str, dict[str, str]], case: tuple[int, str]) -> None:
    workspace, writer, uri, env = setting
    chance = random.Random(500 + case[0])
    table = Table(writer, uri, ROWS)
    epochs = iter(range(1, 1000))

    def reader():  # type: ignore[no-untyped-def]
        return workspace.driver("--chunk-rows", "150", pipeline="table_reader.py", input=uri,
                                env={**env, "SPARK_APP_EPOCH": str(next(epochs))}).start()

    done = threading.Event()
    errors: list[BaseException] = []

    def upstream() -> None:
        try:
            for _ in range(CHANGES):
                table.random_change(chance)
                time.sleep(chance.uniform(0.3, 1.5))
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
        finally:
            done.set()

    driver = reader()
    driver.wait_for_log("backfill accounts: plan 2 ")
    changer = threading.Thread(target=upstream, daemon=True)
    changer.start()
    kills = 0
    while not done.is_set() or kills < MIN_KILLS:
        # Each driver commits a batch first (so that every kill lands mid-stream, after
        # progress), then dies at a random moment: mid-batch, between output and commit,
        # or while its planner writes a plan.
        driver.wait_for_log("query accounts_jsonlines: committed batch")
        time.sleep(chance.uniform(0.0, 3.0))
        driver.kill()
        kills += 1
        driver = reader()
    changer.join()
    assert not errors, errors
    # The last driver started reads the rest, then stops on SIGTERM (it commits and exits 0):
    # no driver of its own to catch up.
    wait_until_passes("the reader caught up with the table", lambda: assert_output_is_the_table(workspace, table),
                      timeout=300, drivers=(driver,))
    driver.terminate()
    assert driver.wait(120) == 0, driver.output()[-3000:]
    assert_output_is_the_table(workspace, table)
    logs = "".join(d.output() for d in workspace.started)
    assert "backfill accounts: resuming at plan" in logs
    assert "rows read (backfill done" in logs, "the backfill never finished"


@pytest.mark.long  # make test: the operator's backfill test pauses, lets go and pauses a running reader's backfill
def test_a_paused_backfill_reads_nothing_until_its_rate_is_raised_while_the_reader_runs(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path, str(tmp_path / "state"))
    writer = Writer(UNUSED_ENDPOINT, {"spark.sql.shuffle.partitions": "2"}, tmp_path / "writer.log")
    live = tmp_path / "live-settings.json"

    def set_rate(rate: float | None) -> None:
        temporary = live.with_suffix(".tmp")  # the kubelet swaps its files atomically too
        temporary.write_text(json.dumps({"backfill": {"accounts": {"rowsPerSecond": rate}}}))
        temporary.rename(live)

    try:
        assert writer.answer(240) == "ready"
        table = Table(writer, str(tmp_path / "table"), 1000)
        set_rate(0)
        driver = workspace.driver("--chunk-rows", "100", pipeline="table_reader.py", input=table.uri,
                                  env={"SPARK_APP_LIVE_SETTINGS_FILE": str(live)}).start()
        driver.wait_for_log("backfill accounts: rate limit changed from unlimited to 0 rows/s")
        driver.wait_for_log("backfill accounts: plan 1 at version 0: 0 changes, 0 rows read")
        table.change({5: 1}, {7})  # nothing is read yet: neither change is forwarded
        driver.wait_for_log("query accounts_jsonlines: committed batch 1 ")
        assert read_changelog(workspace.out / "accounts.jsonlines") == []
        set_rate(300)
        driver.wait_for_log("rate limit changed from 0 to 300 rows/s")
        driver.wait_for_log("rows read (")
        set_rate(None)
        driver.wait_for_log("rate limit changed from 300 to unlimited rows/s")
        driver.wait_for_log("rows read (backfill done")
        driver.terminate()
        assert driver.wait() == 0, driver.output()[-3000:]
        final = workspace.driver("--stop-when-idle", pipeline="table_reader.py", input=table.uri).start()
        assert final.wait() == 0, final.output()[-3000:]
        assert_output_is_the_table(workspace, table)
    finally:
        writer.stop()
        workspace.kill_all()


