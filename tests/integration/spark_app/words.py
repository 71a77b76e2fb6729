"""The input of the two-output test pipeline (pipelines/two_outputs.py), what its
outputs hold once they have read it (counts per word, and the rows with an even n), and
how to wait until both of its queries have read a number of files."""

from __future__ import annotations

import json
from collections import Counter

from tests.integration.spark_app.harness import Driver

QUERIES = ("counts_jsonlines", "even_jsonlines")


def rows(file_number: int) -> list[str]:
    return [f"w{(file_number * 7 + i) % 5},{file_number * 10 + i}" for i in range(6)]


def messages(file_number: int) -> list[bytes]:
    """The rows of ``rows(file_number)`` as Kafka message values (JSON objects)."""
    return [json.dumps({"word": word, "n": int(n)}).encode() for word, n in (r.split(",") for r in rows(file_number))]


def expected_counts(files: range) -> dict[tuple[str], dict[str, object]]:
    table: dict[tuple[str], dict[str, object]] = {}
    for row in (r for f in files for r in rows(f)):
        word, n = row.split(",")
        current = table.get((word,), {"word": word, "count": 0, "total": 0})
        table[(word,)] = {"word": word, "count": current["count"] + 1, "total": current["total"] + int(n)}
    return table


def expected_even(files: range) -> Counter[str]:
    return Counter(
        json.dumps({"word": r.split(",")[0], "n": int(r.split(",")[1])}, sort_keys=True)
        for f in files
        for r in rows(f)
        if int(r.split(",")[1]) % 2 == 0
    )


def wait_for_files(driver: Driver, files: int, timeout: float = 180) -> None:
    """Until each query has committed a batch that read ``files`` files. Each query's own
    line: one may lag the other by several batches (its first batch rides an outage after
    the other's, say), and a stop then leaves it at its last commit."""
    for query in QUERIES:
        driver.wait_for_log(rf"query {query}: committed batch \d+ \(words: {files} files\)", timeout=timeout,
                            pattern=True)
