"""Two Delta writers in two processes race to commit the same version of one table on S3.

A superseded driver can still be running while a newer one writes the same table. The
writer that loses the race must see the other's commit (Delta then retries at the next
version) instead of overwriting it. The race is made exact: the first writer's PUT of the
version file is held by a proxy (it has made every check it makes) and the writer is
frozen with SIGSTOP; the second writer commits that version; the first is thawed and
its PUT let through. The outcome is read from the _delta_log objects themselves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.spark_app.delta_writer import Writer
from tests.support.holding_proxy import HoldingProxy
from tests.support.s3 import S3Server

pytestmark = [pytest.mark.spark, pytest.mark.s3]

DELTA_DEFAULT_S3_LOG_STORE = {"spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore"}
ROWS = {"first": 3, "frozen": 5, "winner": 7}


@contextmanager
def writers(*endpoints: str, spark_conf: dict[str, str], folder: Path) -> Iterator[list[Writer]]:
    """Writers started together (their JVMs start in parallel), each answered "ready"."""
    with ExitStack() as stack:
        started = []
        for number, endpoint in enumerate(endpoints):
            writer = Writer(endpoint, spark_conf, folder / f"writer-{number}.log")
            stack.callback(writer.stop)
            started.append(writer)
        for writer in started:
            assert writer.answer(240) == "ready"
        yield started


@dataclass(frozen=True)
class Commit:
    version: int
    label: str
    rows: int
    """The rows its add actions carry (their statistics' numRecords)."""


def delta_log(s3: Any, bucket: str, table: str) -> list[Commit]:
    """The table's commits, read straight from the _delta_log objects."""
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=f"{table}/_delta_log/")
    keys = sorted(item["Key"] for item in listing.get("Contents", []) if item["Key"].endswith(".json"))
    commits = []
    for key in keys:
        actions = [json.loads(line) for line in s3.get_object(Bucket=bucket, Key=key)["Body"].read().splitlines()]
        info = next(action["commitInfo"] for action in actions if "commitInfo" in action)
        rows = sum(json.loads(action["add"]["stats"])["numRecords"] for action in actions if "add" in action)
        commits.append(Commit(int(key.rsplit("/", 1)[1].removesuffix(".json")), info.get("userMetadata"), rows))
    return commits


@dataclass(frozen=True)
class Race:
    commits: list[Commit]
    winner: str
    """What the writer that committed while the other was frozen answered."""
    frozen: str
    """What the frozen writer answered once thawed."""


def race(s3_server: S3Server, folder: Path, spark_conf: dict[str, str]) -> Race:
    """Version 0 is written, then two writers commit one append each, both on top of it:
    the frozen one first (held with its PUT of version 1 in flight), the winner meanwhile."""
    bucket, table = s3_server.new_bucket(), "shared"
    uri = f"s3a://{bucket}/{table}"
    moto = urlsplit(s3_server.endpoint_url)
    version_1 = f"PUT /{bucket}/{table}/_delta_log/{1:020d}.json ".encode()
    with HoldingProxy((moto.hostname or "", moto.port or 0), version_1) as proxy, \
            writers(proxy.endpoint_url, s3_server.endpoint_url, spark_conf=spark_conf, folder=folder) as started:
        frozen, winner = started
        assert winner.ask(f"append {uri} first {ROWS['first']}") == "appended"
        frozen.send(f"append {uri} frozen {ROWS['frozen']}")
        assert proxy.held.wait(120), f"the frozen writer never committed:\n{frozen.log.read_text()[-3000:]}"
        frozen.freeze()
        try:
            won = winner.ask(f"append {uri} winner {ROWS['winner']}")
        finally:
            frozen.thaw()
            proxy.release()
        thawed = frozen.answer()
        return Race(delta_log(s3_server.client(), bucket, table), won, thawed)


def test_the_writer_that_loses_the_race_commits_at_the_next_version(s3_server: S3Server, tmp_path: Path) -> None:
    result = race(s3_server, tmp_path, spark_conf={})
    assert (result.winner, result.frozen) == ("appended", "appended")
    # One commit per version, none lost: the frozen writer's PUT of version 1 was refused,
    # and Delta retried its append (a blind append does not conflict) at version 2.
    assert result.commits == [Commit(0, "first", ROWS["first"]), Commit(1, "winner", ROWS["winner"]),
                              Commit(2, "frozen", ROWS["frozen"])]


def test_with_deltas_default_s3_log_store_the_same_race_loses_a_commit(s3_server: S3Server,
                                                                      tmp_path: Path) -> None:
    """What the configuration guards against (and proof that the race above is real):
    S3SingleDriverLogStore checks that version 1 is free and then writes it, so both
    writers are told they committed version 1, and the frozen one's PUT replaced the other's."""
    result = race(s3_server, tmp_path, spark_conf=DELTA_DEFAULT_S3_LOG_STORE)
    assert (result.winner, result.frozen) == ("appended", "appended")
    assert result.commits == [Commit(0, "first", ROWS["first"]), Commit(1, "frozen", ROWS["frozen"])]


def test_the_log_store_refuses_a_taken_version_but_accepts_its_own_retried_put(s3_server: S3Server,
                                                                               tmp_path: Path) -> None:
    """A PUT whose response is lost is retried by the AWS SDK and then finds its own commit:
    that is a success, where another writer's commit is a conflict."""
    bucket = s3_server.new_bucket()
    key = f"table/_delta_log/{7:020d}.json"
    with writers(s3_server.endpoint_url, spark_conf={}, folder=tmp_path) as (writer,):
        assert writer.ask(f"put-if-absent s3a://{bucket}/{key} mine") == "written"
        assert writer.ask(f"put-if-absent s3a://{bucket}/{key} mine") == "written"
        assert writer.ask(f"put-if-absent s3a://{bucket}/{key} theirs") == "exists"
    assert s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read() == b"mine\n"
