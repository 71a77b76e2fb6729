"""The JVM's changelog encoder writes what the Python encoder writes, byte for byte.

Outputs compare a key's new row with the one in their state as text, so a difference of
format (a float's digits, an escaped character, a time zone offset) would retract and
insert every equal row once after an upgrade, and mix two formats in one changelog.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import math
import random
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_app.persistence import Backend
from spark_app.runtime.jvm.changelog_encoder import encoded_in_jvm
from spark_app.runtime.jvm.conf import spark_conf
from spark_app.runtime.jvm.session import build_session
from spark_app.runtime.sinks.changelog import chunks, encode

pytestmark = pytest.mark.spark

SCHEMA = (
    "s STRING, b BOOLEAN, i8 TINYINT, i16 SMALLINT, i32 INT, i64 BIGINT, f FLOAT, d DOUBLE, "
    "dec DECIMAL(10,2), tiny DECIMAL(38,18), day DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ, bin BINARY, "
    "ints ARRAY<INT>, nested ARRAY<ARRAY<STRING>>, point STRUCT<x: DOUBLE, tags: ARRAY<STRING>, at: TIMESTAMP>, "
    "nothing VOID"
)

STRINGS = ["", "word", 'quote " and \\ backslash', "tab\tnew\nline\rcr\bbs\fff", "\x00\x01\x1f\x7f",
           "caf\u00e9 \u4e2d\u6587", "astral \U0001f600", "~ and space", "{\"json\": 1}"]
DOUBLES = [0.0, -0.0, 1.0, -1.0, 0.1, 0.2 + 0.1, 1 / 3, 1e16, 1e15, 9999999999999998.0, 1e-4, 1e-5, 0.00012345,
           123456789.125, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 2.0**53, 2.0**-1074 * 3,
           float("nan"), float("inf"), float("-inf"), 100.0, 1e22, 1.5e-7, 12345678901234567890.0]
DECIMALS = ["0", "0.00", "1.5", "-12345678.99", "0.01"]
TINY = ["0", "1E-18", "0.000001", "0.0000001", "123.000000000000000001", "-0.000000123"]
DAYS = [dt.date(1, 1, 1), dt.date(999, 12, 31), dt.date(1582, 10, 4), dt.date(1582, 10, 15), dt.date(1970, 1, 1),
        dt.date(2024, 2, 29), dt.date(9999, 12, 31)]
INSTANTS = [dt.datetime(1970, 1, 1, tzinfo=dt.UTC), dt.datetime(2024, 3, 10, 10, 30, 0, 123456, dt.UTC),
            dt.datetime(2024, 11, 3, 8, 59, 59, 1000, dt.UTC), dt.datetime(1900, 1, 1, 12, tzinfo=dt.UTC),
            dt.datetime(1500, 6, 1, 0, 0, 1, tzinfo=dt.UTC), dt.datetime(9999, 12, 30, 23, tzinfo=dt.UTC)]


def random_doubles(count: int, seed: int) -> list[float]:
    """Bit patterns across the whole range, and decimals of a few digits (averages, prices)."""
    rng = random.Random(seed)
    found = []
    while len(found) < count:
        value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if not math.isnan(value):
            found.append(value)
        found.append(round(rng.uniform(-1e6, 1e6), rng.randint(0, 8)))
        found.append(rng.randint(1, 99) / rng.choice([3, 7, 10, 100, 1000]))
    return found


def rows(count: int, seed: int) -> Iterator[tuple[object, ...]]:
    rng = random.Random(seed)
    doubles = DOUBLES + random_doubles(count, seed)
    for n in range(count):
        def pick(values: list[object], nulls: bool = True) -> object:
            return None if nulls and rng.random() < 0.1 else values[rng.randrange(len(values))]

        d = doubles[n % len(doubles)]
        yield (
            pick(STRINGS), pick([True, False]), pick([-128, 0, 127]), pick([-32768, 7, 32767]),
            pick([-2**31, 0, 42, 2**31 - 1]), pick([-2**63, -1, 2**63 - 1, n]),
            pick([1.5, 0.1, 3.4028234663852886e38, 1e-45, -2.5, float("nan"), float("inf")]), d,
            pick([decimal.Decimal(v) for v in DECIMALS]), pick([decimal.Decimal(v) for v in TINY]),
            pick(DAYS), pick(INSTANTS), pick([i.replace(tzinfo=None) for i in INSTANTS]),
            pick([b"", b"\x00\xff binary", bytes(range(7))]),
            pick([[], [1, None, -3], [2**31 - 1]]), pick([[], [["a", None], []], [["\u00e9\"", "x"]]]),
            pick([(d, ["t", None], INSTANTS[1]), (None, None, None), (-0.0, [], None)]), None,
        )


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield build_session(spark_conf(Backend.filesystem("/tmp"), 10_000,
                                   {"spark.master": "local[2]", "spark.ui.enabled": "false"}))


def python_encoded(df: DataFrame, mode: str, key: tuple[str, ...]) -> bytes:
    encoder = functools.partial(encode, time_ms=1_700_000_000_123, mode=mode, key=key)
    return b"".join(bytes(r["chunk"]) for r in df.mapInArrow(encoder, "chunk binary, lines int").collect())


def jvm_encoded(df: DataFrame, mode: str, key: tuple[str, ...]) -> bytes:
    """What an output writes: encoded in the JVM, fetched through the partitions' files."""
    assert encoded_in_jvm(df, 1_700_000_000_123, mode, key) is not None
    fetched = list(chunks(df, 1_700_000_000_123, mode, key))
    assert sum(lines for _, lines in fetched) == df.count()
    return b"".join(chunk for chunk, _ in fetched)


def assert_same_lines(jvm: bytes, python: bytes) -> None:
    ours, theirs = jvm.decode().splitlines(), python.decode().splitlines()
    for number, (mine, expected) in enumerate(zip(ours, theirs, strict=True)):
        assert mine == expected, f"line {number} differs"
    assert jvm == python


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
@pytest.mark.parametrize(("mode", "key"), [
    ("append", ()), ("keyed", ("s", "i32")), ("keyed", ("d", "missing")), ("append-keyed", ("day", "ts", "point")),
])
def test_every_type_is_written_as_the_python_encoder_writes_it(spark: SparkSession, zone: str, mode: str,
                                                                 key: tuple[str, ...]) -> None:
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        df = spark.createDataFrame(list(rows(3_000, seed=len(zone) + len(mode))), SCHEMA).repartition(3)
        df = df.persist()
        assert_same_lines(jvm_encoded(df, mode, key), python_encoded(df, mode, key))
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")


def test_a_changelogs_own_diff_is_its_lines_diff(spark: SparkSession) -> None:
    df = spark.createDataFrame([("a", 1, 1), ("b", 2, -1), (None, None, 3)], "word STRING, n INT, diff INT")
    assert_same_lines(jvm_encoded(df, "changelog", ()), python_encoded(df, "changelog", ()))
    assert jvm_encoded(df.select("diff"), "changelog", ()) == python_encoded(df.select("diff"), "changelog", ())
    assert jvm_encoded(df.select(F.lit(None).cast("int").alias("x"))
                       .where("x is not null"), "append", ()) == b""


def test_types_the_jvm_encoder_does_not_write_go_to_the_python_encoder(spark: SparkSession) -> None:
    maps = spark.createDataFrame([({"k": 1}, 1)], "m MAP<STRING, INT>, n INT")
    repeated = spark.range(2).select(F.col("id").alias("x"), (F.col("id") + 1).alias("x"))
    assert encoded_in_jvm(maps, 1, "append", ()) is None
    assert encoded_in_jvm(repeated, 1, "append", ()) is None
    assert encoded_in_jvm(maps.select("n"), 1, "append", ()) is not None
    lines = b"".join(chunk for chunk, _ in chunks(maps, 5, "append"))
    assert lines == b'{"m":[["k",1]],"n":1,"time":5,"diff":1}\n'


FETCH_PAST_THE_RESULT_LIMIT = """
import logging, sys
from spark_app.persistence import Backend
from spark_app.runtime.jvm.session import build_session
from spark_app.runtime.jvm.conf import spark_conf
from spark_app.runtime.sinks.changelog import chunks

logging.basicConfig(level=logging.WARNING)
spark = build_session(spark_conf(Backend.filesystem("/tmp"), 10_000, {
    "spark.master": "local[2]", "spark.ui.enabled": "false", "spark.driver.maxResultSize": "1m"}))
df = spark.range(60_000).selectExpr("id", "repeat('x', 40) AS pad").repartition(8)
fetched = list(chunks(df, 7, "append"))
lines = b"".join(chunk for chunk, _ in fetched).decode().splitlines()
assert sum(n for _, n in fetched) == len(lines) == 60_000, len(lines)
assert sorted(int(line.split(",")[0].removeprefix('{"id":')) for line in lines) == list(range(60_000))
print("fetched", len(lines))
"""


def test_a_batch_past_the_drivers_result_limit_is_fetched_a_partition_at_a_time(tmp_path: Path) -> None:
    """One job's results count against spark.driver.maxResultSize together; a partition
    at a time, each job's do alone, as before the one-job fetch."""
    run = subprocess.run([sys.executable, "-c", FETCH_PAST_THE_RESULT_LIMIT], capture_output=True, text=True,
                         cwd=Path(__file__).parents[3], timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "fetched 60000" in run.stdout
    assert "larger than spark.driver.maxResultSize; fetching it a partition at a time" in run.stderr
