"""A batch as changelog lines (a row's JSON object with ``time`` and ``diff``), shared by
the outputs that write changelogs: a JSON-lines file, a Kafka topic (one message a line).

Rows are encoded in Spark's tasks and reach the driver through local files, a partition
each, so a large batch is never held whole in the driver's memory. The tasks encode in
the JVM (runtime/jvm/changelog_encoder.py) when every column's type is one the JVM
encoder writes byte for byte as ``encode`` here does, and in a Python worker otherwise.
A keyed output's changes (-1 of the row last emitted for a key, +1 of the new one) are
computed in the driver against its ``OutputState``.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import json
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from spark_app.runtime.jvm.changelog_encoder import encoded_in_jvm, fetch
from spark_app.runtime.jvm.map_in_arrow import map_in_arrow
from spark_app.runtime.sinks.keyed_state import OutputState, encode_key

_CHUNK = "chunk"


def chunks(df: DataFrame, time_ms: int, mode: str, key: Sequence[str] | None = None,
           ) -> Generator[tuple[bytes, int], None, None]:
    """``df`` encoded in Spark's tasks (``encode``, or its JVM twin) and fetched in one job
    (runtime/jvm/changelog_encoder.py), as (bytes, lines) chunks in the rows' order."""
    encoded = encoded_in_jvm(df, time_ms, mode, tuple(key or ()))
    if encoded is None:
        encoder = functools.partial(encode, time_ms=time_ms, mode=mode, key=tuple(key or ()))
        encoded = map_in_arrow(df, encoder, f"{_CHUNK} binary, lines int")
    yield from fetch(encoded)


def encode(batches: Iterable[pa.RecordBatch], *, time_ms: int, mode: str, key: tuple[str, ...],
           ) -> Iterator[pa.RecordBatch]:
    """Runs in Spark's Python workers. ``append``: changelog lines with diff +1;
    ``changelog``: lines with the rows' own diff; ``keyed``: ``key<TAB>row`` lines, which
    the driver turns into changes against the rows it emitted last; ``append-keyed``:
    ``key<TAB>line``, changelog lines with diff +1 and their key."""
    for batch in batches:
        rows = [_jsonable(row) for row in batch.to_pylist()]
        if mode == "keyed":
            text = "".join(_key(row, key) + "\t" + _canonical(row) + "\n" for row in rows)
        elif mode == "append-keyed":
            text = "".join(_key(row, key) + "\t" + line(_canonical(row), time_ms, 1) for row in rows)
        elif mode == "changelog":
            text = "".join(line(_canonical({k: v for k, v in row.items() if k != "diff"}), time_ms, int(row["diff"]))
                           for row in rows)
        else:
            text = "".join(line(_canonical(row), time_ms, 1) for row in rows)
        yield pa.RecordBatch.from_arrays([pa.array([text.encode()], pa.binary()), pa.array([len(rows)], pa.int32())],
                                         names=[_CHUNK, "lines"])


def line(encoded_row: str, time_ms: int, diff: int) -> str:
    """A changelog line: the row's JSON object with ``time`` and ``diff`` added last."""
    if encoded_row == "{}":
        return json.dumps({"time": time_ms, "diff": diff}, separators=(",", ":")) + "\n"
    return f'{encoded_row[:-1]},"time":{time_ms},"diff":{diff}}}\n'


def keyed_changes(state: OutputState, chunk: bytes, time_ms: int) -> list[tuple[str, str]]:
    """The changes of a chunk of keyed rows (``key<TAB>row`` lines) against the rows last
    emitted, as (key, changelog line) pairs in order; updates ``state`` within the batch's
    transaction."""
    keyed = dict(entry.split("\t", 1) for entry in chunk.decode().splitlines())  # the last update of a key wins
    old = state.lookup(keyed)
    changes: list[tuple[str, str]] = []
    updates = []
    for key, encoded in keyed.items():
        previous = old.get(key)
        if previous == encoded:
            continue
        if previous is not None:
            changes.append((key, line(previous, time_ms, -1)))
        changes.append((key, line(encoded, time_ms, 1)))
        updates.append((key, encoded))
    state.upsert(updates)
    return changes


def _key(row: dict[str, Any], key: tuple[str, ...]) -> str:
    return encode_key([row.get(c) for c in key])


def _canonical(row: dict[str, Any]) -> str:
    # Column order is fixed by the query's schema, so it is kept: retractions then read
    # like the rows they retract.
    return json.dumps(row, separators=(",", ":"), default=str)


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: _json_value(v) for k, v in row.items()}


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value
