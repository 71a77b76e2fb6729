"""Reading a source's files in tasks: block by block, as admitted, whatever happened since."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from spark_app.persistence import Backend
from spark_app.runtime.sources import files as file_source
from spark_app.runtime.sources.dead_letters import SetAside, count_dead_letters, dead_letter_key
from spark_app.runtime.sources.files import ReadPlan, read_files
from spark_app.runtime.sources.inputs import InputLocation
from spark_app.runtime.sources.parsing import CsvFormat
from spark_app.storage import FileEntry

WORDS = pa.schema([("word", pa.string()), ("n", pa.int32())])


def plan(tmp_path: Path, fmt: str = "csv") -> ReadPlan:
    return ReadPlan("words", fmt, InputLocation(Backend.filesystem(tmp_path / "in")),
                    Backend.filesystem(tmp_path / "dead"), CsvFormat(), WORDS)


def admit(tmp_path: Path, name: str, data: bytes) -> FileEntry:
    path = tmp_path / "in" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return FileEntry(name, len(data), 0)


def rows(p: ReadPlan, entries: list[FileEntry], read_as: list[str | None] | None = None) -> list[dict[str, object]]:
    return [row for batch in read_files(p, entries, read_as or [None] * len(entries)) for row in batch.to_pylist()]


def dead(tmp_path: Path, name: str) -> list[dict[str, object]]:
    path = tmp_path / "dead" / dead_letter_key("words", name)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_large_file_is_read_in_blocks_with_its_own_line_numbers(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(file_source, "BLOCK_BYTES", 16)
    lines = [f"w{i},{i}" if i != 37 else "bad,x" for i in range(60)]
    entry = admit(tmp_path, "a.csv", ("word,n\n" + "\n".join(lines) + "\n").encode())
    got = rows(plan(tmp_path), [entry])
    assert got == [{"word": f"w{i}", "n": i} for i in range(60) if i != 37]
    assert [(r["line"], r["raw"]) for r in dead(tmp_path, "a.csv")] == [(39, "bad,x")]


def test_a_line_longer_than_a_block_is_read_whole(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(file_source, "BLOCK_BYTES", 8)
    long = "x" * 50
    entry = admit(tmp_path, "a.jsonl", f'{{"word":"{long}","n":1}}\n{{"word":"b","n":2}}\n'.encode())
    assert rows(plan(tmp_path, "jsonlines"), [entry]) == [{"word": long, "n": 1}, {"word": "b", "n": 2}]


def test_a_file_deleted_after_admission_is_recorded_and_skipped(tmp_path: Path) -> None:
    gone = admit(tmp_path, "gone.csv", b"word,n\na,1\n")
    kept = admit(tmp_path, "kept.csv", b"word,n\nb,2\n")
    (tmp_path / "in" / "gone.csv").unlink()
    p = plan(tmp_path)
    assert rows(p, [gone, kept]) == [{"word": "b", "n": 2}]
    assert [r["error"] for r in dead(tmp_path, "gone.csv")] == [
        "the file was deleted after it was admitted; nothing of it was read"]
    assert count_dead_letters(p.dead_letter, "words", [gone.path, kept.path]) == SetAside(rows=0, files=1)


def test_a_file_that_grew_is_read_as_admitted_and_reported(tmp_path: Path) -> None:
    entry = admit(tmp_path, "a.csv", b"word,n\na,1\n")
    with open(tmp_path / "in" / "a.csv", "ab") as handle:
        handle.write(b"b,2\n")
    p = plan(tmp_path)
    assert rows(p, [entry]) == [{"word": "a", "n": 1}]
    assert "grew after it was admitted" in str(dead(tmp_path, "a.csv")[0]["error"])
    assert rows(p, [entry]) == [{"word": "a", "n": 1}]  # a replay reads the same bytes


def test_a_file_that_shrank_is_read_as_far_as_it_goes_and_reported(tmp_path: Path) -> None:
    entry = admit(tmp_path, "a.csv", b"word,n\na,1\nb,2\nc,3\n")
    (tmp_path / "in" / "a.csv").write_bytes(b"word,n\na,1\n")
    p = plan(tmp_path)
    assert rows(p, [entry]) == [{"word": "a", "n": 1}]
    assert "shorter than when it was admitted" in str(dead(tmp_path, "a.csv")[0]["error"])
    assert count_dead_letters(p.dead_letter, "words", [entry.path]).files == 1


@pytest.mark.parametrize("data", [b"word,n\na,1\n\xffb,2\nc,3\n", b'word,n\na,1\n"b,2\nc,3\n'])
def test_malformed_rows_are_counted_as_rows(tmp_path: Path, data: bytes) -> None:
    entry = admit(tmp_path, "a.csv", data)
    p = plan(tmp_path)
    assert rows(p, [entry]) == [{"word": "a", "n": 1}, {"word": "c", "n": 3}]
    assert count_dead_letters(p.dead_letter, "words", [entry.path]) == SetAside(rows=1, files=0)


def test_planning_a_batch_gives_up_on_unreachable_state_storage_within_the_outage_budget(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The driver's outage budget bounds the source's own storage calls too: a batch planned
    while the state's S3 server is gone fails within the budget (the driver then exits with
    EXIT_STORAGE_UNAVAILABLE), rather than retrying for the default 15 minutes while the
    driver looks healthy. Found by the operator's outage test, where new input arrived
    during the outage."""
    import threading

    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    from spark_app.runtime.sources.files import FileStreamReader
    from spark_app.storage import StorageUnavailable

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unit")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "unit-secret")
    admit(tmp_path, "a.csv", b"word,n\nx,1\n")
    gone = Backend.s3("s3://gone/state", endpoint_url="http://127.0.0.1:9", region="us-east-1")
    context = tmp_path / "context.json"
    context.write_text(json.dumps({"snapshot": gone.to_json(), "dead_letter": Backend.filesystem(tmp_path / "dead").to_json(),
                                   "limits": {}, "outage_budget_s": 1}))
    reader = FileStreamReader({"context": str(context), "persistent_id": "words", "format": "csv",
                               "input": json.dumps(Backend.filesystem(tmp_path / "in").to_json())},
                              StructType([StructField("word", StringType()), StructField("n", IntegerType())]))
    raised: list[BaseException] = []

    def plan_a_batch() -> None:
        try:
            reader.latestOffset()
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            raised.append(error)

    planning = threading.Thread(target=plan_a_batch, daemon=True)
    planning.start()
    planning.join(timeout=60)
    assert not planning.is_alive(), "the source kept retrying past the outage budget"
    assert raised and isinstance(raised[0], StorageUnavailable), raised


def test_the_reader_plans_on_the_driver_and_each_partition_reads_itself_in_a_task(tmp_path: Path) -> None:
    """The driver's planner pickles each partition into the plan (planned.DriverPlanner);
    a task unpickles it and reads it with nothing else (no reader, no index)."""
    import base64
    import pickle

    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    from spark_app.runtime.sources.files import FileStreamReader
    from spark_app.runtime.sources.planned import DriverPlanner
    from spark_app.runtime.sources.reader import ReadsItself, SourceOrderChanged

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_bytes(b"word,n\nx,1\n")
    context = tmp_path / "context.json"
    context.write_text(json.dumps({"snapshot": Backend.filesystem(tmp_path / "state").to_json(),
                                   "dead_letter": Backend.filesystem(tmp_path / "dead").to_json(), "limits": {}}))
    planner = DriverPlanner(lambda: FileStreamReader(
        {"context": str(context), "persistent_id": "words", "format": "csv",
         "input": json.dumps(Backend.filesystem(tmp_path / "in").to_json())},
        StructType([StructField("word", StringType()), StructField("n", IntegerType())])))
    start = planner.initialOffset("s1")
    assert json.loads(start) == {"source": "words", "files": 0}
    end = planner.latestOffset("s1")
    assert json.loads(end) == {"source": "words", "files": 1}
    [line] = planner.partitions("s1", start, end).splitlines()
    partition = pickle.loads(base64.b64decode(line))
    assert isinstance(partition, ReadsItself)
    assert [batch.num_rows for batch in partition.read()] == [1]
    with pytest.raises(SourceOrderChanged):
        planner.partitions("s1", json.dumps({"source": "other", "files": 0}), end)
    # A restarted stream is told where its query stands, and plans on from there.
    planner.seen("s2", end)
    assert planner.latestOffset("s2") == end


def test_each_file_is_read_as_its_source_read_when_it_was_admitted(tmp_path: Path) -> None:
    """A source that moved from JSON lines to semicolon-separated CSV still reads a file
    admitted before the move as JSON lines (a replayed batch reads what it read first)."""
    old = admit(tmp_path, "a.jsonl", b'{"word": "a", "n": 1}\n{"word": "b", "n": 2}\n')
    new = admit(tmp_path, "b.csv", b"word;n\nc;3\n")
    then = plan(tmp_path, "jsonlines")
    now = ReadPlan("words", "csv", then.input, then.dead_letter, CsvFormat(delimiter=";"), WORDS)
    assert now.as_admitted(now.read_as()) is now and now.as_admitted(None) is now
    assert now.as_admitted(then.read_as()).format == "jsonlines"
    assert rows(now, [old, new], [then.read_as(), now.read_as()]) == [
        {"word": "a", "n": 1}, {"word": "b", "n": 2}, {"word": "c", "n": 3}]
    assert rows(now, [new], [None]) == [{"word": "c", "n": 3}]  # unrecorded: as the source reads now
    assert dead(tmp_path, "a.jsonl") == [] and dead(tmp_path, "b.csv") == []
