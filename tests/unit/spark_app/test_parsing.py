"""Parsing files into rows, setting malformed rows aside with their reason."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_app.runtime.sources.parsing import CsvFormat, parse_csv, parse_jsonlines

WORDS = pa.schema([("word", pa.string()), ("n", pa.int32())])


def test_csv_rows_are_matched_by_header_and_typed() -> None:
    parsed = parse_csv(b"n,word,extra\n1,hello,x\n2,world,y\n", WORDS)
    assert parsed.table.to_pylist() == [{"word": "hello", "n": 1}, {"word": "world", "n": 2}]
    assert parsed.rejected == []


def test_csv_bad_values_and_bad_rows_are_rejected_with_line_and_reason() -> None:
    parsed = parse_csv(b"word,n\nok,1\nbad,abc\ntoo,many,fields\nbig,99999999999\nfine,2\n", WORDS)
    assert parsed.table.to_pylist() == [{"word": "ok", "n": 1}, {"word": "fine", "n": 2}]
    assert [(r.line, r.raw, r.error) for r in parsed.rejected] == [
        (3, "bad,abc", "column 'n': cannot read 'abc' as INT"),
        (4, "too,many,fields", "expected 2 fields, found 3"),
        (5, "big,99999999999", "column 'n': cannot read '99999999999' as INT"),
    ]


def test_parsing_rows_good_and_bad_imports_no_pandas() -> None:
    """pyarrow imports pandas (0.3 s on the test machine) at its first conversion of Python
    values; parsing runs in every Python worker's first task, and needs none."""
    code = ("import sys, pyarrow as pa\n"
            "from spark_app.runtime.sources.parsing import parse_csv\n"
            "schema = pa.schema([('word', pa.string()), ('n', pa.int32()), ('ts', pa.timestamp('us', tz='UTC'))])\n"
            "parsed = parse_csv(b'word,n,ts\\nok,1,2024-01-01 10:00:00\\nbad,abc,2024-01-01T12:00:00+02:00\\n', schema)\n"
            "assert parsed.table.num_rows == 1 and len(parsed.rejected) == 1, parsed\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_csv_without_a_schema_column_rejects_every_row() -> None:
    parsed = parse_csv(b"word\na\nb\n", WORDS)
    assert parsed.table.num_rows == 0
    assert [r.error for r in parsed.rejected] == ["the header has no column 'n'"] * 2


def test_csv_without_header_uses_schema_order_and_other_delimiters() -> None:
    parsed = parse_csv(b"a;1\nb;2\n", WORDS, CsvFormat(header=False, delimiter=";"))
    assert parsed.table.to_pylist() == [{"word": "a", "n": 1}, {"word": "b", "n": 2}]


def test_empty_values_are_null_and_empty_files_give_no_rows() -> None:
    assert parse_csv(b"word,n\n,\n", WORDS).table.to_pylist() == [{"word": None, "n": None}]
    assert parse_csv(b"", WORDS).table.num_rows == 0
    assert parse_csv(b"word,n\n", WORDS).table.num_rows == 0


def test_timestamps_without_offset_are_utc() -> None:
    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC"))])
    parsed = parse_csv(b"ts\n2024-01-01 10:00:00\n2024-01-01T12:00:00+02:00\nyesterday\n", schema)
    assert [v.isoformat() for v in parsed.table.column("ts").to_pylist()] == [
        "2024-01-01T10:00:00+00:00", "2024-01-01T10:00:00+00:00"]
    assert parsed.rejected[0].line == 4


def test_jsonlines_rejects_lines_that_do_not_fit() -> None:
    data = b'{"word":"a","n":1}\n{"word":"b","n":"x"}\nnot json\n[1]\n\n{"word":"c","other":true}\n'
    parsed = parse_jsonlines(data, WORDS)
    assert parsed.table.to_pylist() == [{"word": "a", "n": 1}, {"word": "c", "n": None}]
    assert [r.line for r in parsed.rejected] == [2, 3, 4]
    assert parsed.rejected[0].error == "column 'n': cannot read 'x' as INT"
    assert parsed.rejected[1].error.startswith("not valid JSON")
    assert parsed.rejected[2].error == "expected a JSON object, found list"


def test_a_json_null_line_is_set_aside_not_read_as_a_row_of_nulls() -> None:
    # pyarrow reads a line holding only `null` as a row whose columns are all null.
    parsed = parse_jsonlines(b'{"word":"a","n":1}\n null \n{"word":"b","n":2}\n', WORDS)
    assert parsed.table.to_pylist() == [{"word": "a", "n": 1}, {"word": "b", "n": 2}]
    assert [(r.line, r.raw, r.error) for r in parsed.rejected] == [(2, " null ", "expected a JSON object, found null")]


def test_a_json_line_that_is_not_utf8_is_set_aside_as_csv_lines_are() -> None:
    # pyarrow kept it: a string column holding bytes that are not UTF-8.
    parsed = parse_jsonlines(b'{"word":"a","n":1}\n{"word":"w\xff","n":2}\n{"word":"b","n":3}\n', WORDS)
    assert parsed.table.to_pylist() == [{"word": "a", "n": 1}, {"word": "b", "n": 3}]
    parsed.table.validate(full=True)
    assert [(r.line, r.raw, r.error) for r in parsed.rejected] == [
        (2, '{"word":"w\ufffd","n":2}', "is not valid UTF-8 (byte 0xff at column 11)")]


def test_a_json_null_first_line_is_set_aside_without_crashing_the_parser() -> None:
    # pyarrow 26 dies (SIGSEGV) on data whose first line is `null`: the Python worker, then
    # the task four times, then the driver, and every restart on the same input.
    parsed = parse_jsonlines(b'null\n{"word":"a","n":1}\n', WORDS)
    assert parsed.table.to_pylist() == [{"word": "a", "n": 1}]
    assert [(r.line, r.error) for r in parsed.rejected] == [(1, "expected a JSON object, found null")]
    assert parse_jsonlines(b"null", WORDS).rejected[0].error == "expected a JSON object, found null"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.integers(-(2**31), 2**31 - 1).map(str), st.text("abc!", min_size=1, max_size=4)),
                max_size=30))
def test_a_bad_row_never_changes_how_good_rows_are_read(values: list[str]) -> None:
    body = "word,n\n" + "".join(f"w{i},{v}\n" for i, v in enumerate(values))
    parsed = parse_csv(body.encode(), WORDS)
    alone = [parse_csv(f"word,n\nw{i},{v}\n".encode(), WORDS) for i, v in enumerate(values)]
    assert parsed.table.to_pylist() == [row for p in alone for row in p.table.to_pylist()]
    assert len(parsed.rejected) == sum(len(p.rejected) for p in alone)
    assert parsed.table.num_rows + len(parsed.rejected) == len(values)


def test_csv_invalid_utf8_sets_aside_only_its_row() -> None:
    parsed = parse_csv(b"word,n\napple,1\n\xff\xfebad,2\npear,3\n", WORDS)
    assert parsed.table.to_pylist() == [{"word": "apple", "n": 1}, {"word": "pear", "n": 3}]
    assert [(r.line, r.error) for r in parsed.rejected] == [(3, "is not valid UTF-8 (byte 0xff at column 1)")]
    assert parsed.rejected[0].raw == "\ufffd\ufffdbad,2"


def test_csv_unbalanced_quote_sets_aside_only_its_line() -> None:
    parsed = parse_csv(b'word,n\napple,1\n"unbalanced,2\npear,3\nplum,4\n', WORDS)
    assert parsed.table.to_pylist() == [{"word": "apple", "n": 1}, {"word": "pear", "n": 3}, {"word": "plum", "n": 4}]
    assert [(r.line, r.raw, r.error) for r in parsed.rejected] == [
        (3, '"unbalanced,2', "has a quoted field that is not closed on its line")]


def test_csv_bad_lines_and_bad_values_together_keep_their_line_numbers() -> None:
    data = b'word,n\na,1\n"open,2\nb,x\n\xc3(,3\nc,4\ntoo,many,5\n'
    parsed = parse_csv(data, WORDS)
    assert parsed.table.to_pylist() == [{"word": "a", "n": 1}, {"word": "c", "n": 4}]
    assert [r.line for r in parsed.rejected] == [3, 4, 5, 7]


def test_a_header_that_cannot_be_read_rejects_the_file_with_the_reason() -> None:
    parsed = parse_csv(b'wo\xffrd,n\na,1\nb,2\n', WORDS)
    assert parsed.table.num_rows == 0
    assert [(r.line, r.raw, r.error) for r in parsed.rejected] == [
        (2, "a,1", "the header on line 1 is not valid UTF-8 (byte 0xff at column 3)"),
        (3, "b,2", "the header on line 1 is not valid UTF-8 (byte 0xff at column 3)")]


def test_line_numbers_can_start_later_in_the_file() -> None:
    """A block of a large file: its lines are numbered where they are in the file."""
    parsed = parse_csv(b"word,n\nok,1\nbad,x\n", WORDS, first_line=101)
    assert [r.line for r in parsed.rejected] == [102]
    parsed = parse_jsonlines(b'{"word":"a","n":1}\n{"word":"b","n":"x"}\n', WORDS, first_line=51)
    assert [r.line for r in parsed.rejected] == [52]
