"""Parsing input files into Arrow record batches, setting malformed rows aside.

Pure pyarrow, no Spark. Each function returns the rows that conform to the schema and
one ``Rejected`` per row that does not, with the reason. The result is a function of
the file's bytes alone, which is what makes dead-lettering exactly-once: reading a file
again (a replayed batch, a retried task) rejects the same rows with the same messages.

A row is accepted or rejected by the same rule on the fast path (the whole file at
once) and on the slow path (row by row, taken only when the fast path fails), so the
presence of one bad row never changes how the good rows are read.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson


@dataclass(frozen=True)
class Rejected:
    line: int | None
    """Physical line number in the file (1-based), assuming one record per line."""
    raw: str
    error: str

    def to_json(self) -> dict[str, object]:
        return {"line": self.line, "raw": self.raw, "error": self.error}


@dataclass(frozen=True)
class Parsed:
    table: pa.Table
    rejected: list[Rejected]


@dataclass(frozen=True)
class CsvFormat:
    header: bool = True
    delimiter: str = ","
    quote: str = '"'


def parse_csv(data: bytes, schema: pa.Schema, fmt: CsvFormat = CsvFormat(), first_line: int | None = None) -> Parsed:
    """The rows of CSV ``data``. ``first_line`` is the number, in the file, of its first
    data line (after the header), for a block read from the middle of a large file; by
    default ``data`` is the whole file."""
    offset = 0 if first_line is None else first_line - (2 if fmt.header else 1)
    if _utf8_problem(data) is not None:  # pyarrow cannot hand a row that is not UTF-8 to on_invalid_row
        return _parse_csv_by_line(data, schema, fmt, offset)
    fast = _parse_csv_fast(data, schema, fmt)
    if fast is not None:
        return _renumbered(fast, lambda line: line + offset)
    return _parse_csv_by_line(data, schema, fmt, offset)


def _parse_csv_fast(data: bytes, schema: pa.Schema, fmt: CsvFormat) -> Parsed | None:
    """The whole file at once (lines numbered from 1, the header included); None if a line
    cannot be told apart from the next (invalid UTF-8, a quote left open), which the slow
    path then finds."""
    rejected: list[Rejected] = []

    def on_invalid_row(row: pacsv.InvalidRow) -> str:
        rejected.append(Rejected(
            line=row.number,
            raw=row.text,
            error=f"expected {row.expected_columns} fields, found {row.actual_columns}",
        ))
        return "skip"

    names = None if fmt.header else schema.names
    try:
        strings = pacsv.read_csv(
            io.BytesIO(data),
            read_options=pacsv.ReadOptions(use_threads=False, column_names=names),
            parse_options=pacsv.ParseOptions(
                delimiter=fmt.delimiter, quote_char=fmt.quote, invalid_row_handler=on_invalid_row
            ),
            convert_options=pacsv.ConvertOptions(
                column_types=_all_strings(data, schema, fmt), strings_can_be_null=True, null_values=[""]
            ),
        )
    except pa.ArrowInvalid as error:
        if b"Empty CSV file" in str(error).encode() or not data.strip():
            return Parsed(schema.empty_table(), rejected)
        return None
    except UnicodeDecodeError:  # the text of an invalid row, handed to on_invalid_row
        return None
    if any("\n" in r.raw for r in rejected):  # an open quote swallowed the lines after it
        return None
    try:
        strings.column_names  # noqa: B018 - a header that is not UTF-8 fails here
    except UnicodeDecodeError:
        return None

    first_data_line = 2 if fmt.header else 1
    lines = _csv_line_numbers(strings.num_rows, first_data_line, {r.line for r in rejected if r.line})
    missing = [name for name in schema.names if name not in strings.column_names]
    if missing:
        problem = f"the header has no column {', '.join(repr(m) for m in missing)}"
        rows = [Rejected(lines[i], _csv_raw(strings, i, fmt), problem) for i in range(strings.num_rows)]
        return Parsed(schema.empty_table(), rejected + rows)

    columns, errors = _convert_columns(strings, schema)
    rejected += [
        Rejected(lines[i], _csv_raw(strings, i, fmt), "; ".join(errors[i])) for i in sorted(errors)
    ]
    if errors:
        good = _good_rows(strings.num_rows, errors)
        columns = [c.filter(good) for c in columns]
    table = pa.Table.from_arrays(columns, schema=schema)
    return Parsed(table, sorted(rejected, key=lambda r: r.line or 0))


def _parse_csv_by_line(data: bytes, schema: pa.Schema, fmt: CsvFormat, offset: int) -> Parsed:
    """Sets aside the lines that no CSV parser can delimit (not UTF-8, a quoted field not
    closed on its line), then reads the others at once; line numbers stay the file's."""
    lines = list(enumerate(data.split(b"\n"), start=1))
    if lines and not lines[-1][1]:
        lines.pop()
    kept: list[bytes] = []
    numbers: list[int] = []  # the line number (in ``data``) of each kept line
    if fmt.header and lines:
        _, header = lines.pop(0)
        problem = _line_problem(header, fmt)
        if problem is not None:  # no row can be matched to its columns
            return Parsed(schema.empty_table(), [Rejected(number + offset, _text(line), f"the header on line 1 {problem}")
                                                 for number, line in lines if line.strip()])
        kept.append(header)
        numbers.append(1)
    rejected: list[Rejected] = []
    for number, line in lines:
        problem = _line_problem(line, fmt)
        if problem is None:
            kept.append(line)
            numbers.append(number)
        else:
            rejected.append(Rejected(number + offset, _text(line), problem))
    parsed = _parse_csv_fast(b"\n".join(kept) + b"\n", schema, fmt)
    if parsed is None:  # not expected once the lines are clean; set the rest aside, never drop it
        first = 1 if fmt.header else 0
        parsed = Parsed(schema.empty_table(), [Rejected(i + 1, _text(kept[i]), "unreadable CSV line")
                                               for i in range(first, len(kept))])
    moved = _renumbered(parsed, lambda line: numbers[line - 1] + offset)
    return Parsed(moved.table, sorted(rejected + moved.rejected, key=lambda r: r.line or 0))


def _line_problem(line: bytes, fmt: CsvFormat) -> str | None:
    problem = _utf8_problem(line)
    if problem is None and _open_quote(line.decode("utf-8").rstrip("\r"), fmt):
        return "has a quoted field that is not closed on its line"
    return problem


def _utf8_problem(line: bytes) -> str | None:
    if line.isascii():  # most input: checked without decoding a copy of it
        return None
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as error:
        return f"is not valid UTF-8 (byte 0x{line[error.start]:02x} at column {error.start + 1})"
    return None


def _open_quote(text: str, fmt: CsvFormat) -> bool:
    """Whether a field of ``text`` opens a quote that the line does not close (a quote
    counts only at the start of a field; a doubled quote inside one is a quote)."""
    i, quoted, field_start = 0, False, True
    while i < len(text):
        char = text[i]
        if quoted:
            if char == fmt.quote:
                if i + 1 < len(text) and text[i + 1] == fmt.quote:
                    i += 1
                else:
                    quoted = False
        elif char == fmt.quote and field_start:
            quoted = True
        field_start = not quoted and char == fmt.delimiter
        i += 1
    return quoted


def _renumbered(parsed: Parsed, number: Callable[[int], int]) -> Parsed:
    return Parsed(parsed.table, [Rejected(number(r.line) if r.line is not None else None, r.raw, r.error)
                                 for r in parsed.rejected])


def _text(line: bytes) -> str:
    return line.decode("utf-8", "replace").rstrip("\r")


def parse_jsonlines(data: bytes, schema: pa.Schema, first_line: int = 1) -> Parsed:
    """The objects of JSON-lines ``data``; ``first_line`` numbers its first line in the file.
    Bad lines are found by halving: a few bad lines in a large file cost a few dozen
    parses, not one per line."""
    # Lines pyarrow must not see: it reads a `null` line as a row of nulls, dies (SIGSEGV)
    # on data that starts with one, and keeps bytes that are not UTF-8 in its strings.
    screen = _NULL_LINES.search(data) is not None or _utf8_problem(data) is not None
    if not screen:
        try:
            return Parsed(_read_json(data, schema), [])
        except _JSON_ERRORS:
            pass
    lines = [(n, line) for n, line in enumerate(data.splitlines(), start=first_line) if line.strip()]
    tables: list[pa.Table] = []
    rejected: list[Rejected] = []
    if screen:
        problems = {n: _json_line_problem(line) for n, line in lines}
        rejected += [Rejected(n, line.decode("utf-8", "replace"), problem)
                     for n, line in lines if (problem := problems[n]) is not None]
        lines = [(n, line) for n, line in lines if problems[n] is None]
    pending = [lines]
    while pending:
        part = pending.pop()
        try:
            tables.append(_read_json(b"\n".join(line for _, line in part), schema))
            continue
        except _JSON_ERRORS as error:
            if len(part) == 1:
                number, line = part[0]
                rejected.append(Rejected(number, line.decode("utf-8", "replace"), _json_error(line, error, schema)))
                continue
        middle = len(part) // 2
        pending += [part[middle:], part[:middle]]  # the first half is read first: rows keep their order
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return Parsed(table, sorted(rejected, key=lambda r: r.line or 0))


_JSON_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


_NULL_LINE = re.compile(rb"[ \t\r]*null[ \t\r]*")
"""A JSON-lines line whose value is null (JSON's whitespace around it)."""
_NULL_LINES = re.compile(rb"^[ \t\r]*null[ \t\r]*$", re.MULTILINE)


def _json_line_problem(line: bytes) -> str | None:
    if _NULL_LINE.fullmatch(line):
        return "expected a JSON object, found null"
    return _utf8_problem(line)


def _read_json(data: bytes, schema: pa.Schema) -> pa.Table:
    if not data.strip():
        return schema.empty_table()
    table = pajson.read_json(
        io.BytesIO(data),
        read_options=pajson.ReadOptions(use_threads=False),
        parse_options=pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )
    return table.select(schema.names).cast(schema)


def _json_error(line: bytes, error: Exception, schema: pa.Schema) -> str:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as decode_error:
        return f"not valid JSON: {decode_error.msg} at column {decode_error.colno}"
    if not isinstance(value, dict):
        return f"expected a JSON object, found {type(value).__name__}"
    for field in schema:
        if field.name in value and not _fits(value[field.name], field.type):
            found = value[field.name]
            text = found if isinstance(found, str) else json.dumps(found)
            return f"column {field.name!r}: cannot read {text[:200]!r} as {_type_name(field.type)}"
    return str(error).split("\n")[0].removeprefix("JSON parse error: ")


def _fits(value: object, data_type: pa.DataType) -> bool:
    """Whether one JSON value reads as ``data_type`` (Arrow's message names neither)."""
    try:
        _read_json(json.dumps({"v": value}).encode(), pa.schema([("v", data_type)]))
    except _JSON_ERRORS:
        return False
    return True


def _all_strings(data: bytes, schema: pa.Schema, fmt: CsvFormat) -> dict[str, pa.DataType]:
    # Every column is read as text first; typed conversion happens per column so that a
    # bad value rejects one row instead of failing the whole file.
    if not fmt.header:
        return {name: pa.string() for name in schema.names}
    header = next(csv.reader([_first_line(data)], delimiter=fmt.delimiter, quotechar=fmt.quote), [])
    return {name: pa.string() for name in header}


def _convert_columns(strings: pa.Table, schema: pa.Schema) -> tuple[list[pa.Array], dict[int, list[str]]]:
    columns: list[pa.Array] = []
    errors: dict[int, list[str]] = {}
    for field in schema:
        text = strings.column(field.name).combine_chunks()
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            columns.append(text.cast(field.type))
            continue
        try:
            columns.append(_cast_text(text, field.type))
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        # Row by row, to tell each value that cannot be read (a null in its place), on
        # Arrow slices rather than Python values (see _good_rows).
        pieces = []
        for row in range(len(text)):
            try:
                pieces.append(_cast_text(text.slice(row, 1), field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                errors.setdefault(row, []).append(
                    f"column {field.name!r}: cannot read {text[row].as_py()!r} as {_type_name(field.type)}")
                pieces.append(pa.nulls(1, field.type))
        columns.append(pa.concat_arrays(pieces))
    return columns, errors


def _cast_text(text: pa.Array, target: pa.DataType) -> pa.Array:
    """Text to ``target``; timestamps without a zone offset are read as UTC (as Spark does
    with spark.sql.session.timeZone=UTC, which spark_app sets)."""
    if pa.types.is_timestamp(target) and target.tz is not None:
        try:
            return pc.cast(text, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return pc.cast(text, pa.timestamp(target.unit)).cast(target)
    return pc.cast(text, target)


def _good_rows(rows: int, bad: Iterable[int]) -> pa.Array:
    """A boolean array of ``rows``, false at ``bad``.

    Built from its bitmap: pyarrow imports pandas at its first conversion of Python values
    (``pa.array`` of a list, even ``pa.scalar``), 0.3 s of a Python worker's first task on
    the test machine, for a module nothing here uses."""
    bits = bytearray(b"\xff" * ((rows + 7) // 8))
    for row in bad:
        bits[row // 8] &= 0xFF ^ (1 << (row % 8))
    return pa.Array.from_buffers(pa.bool_(), rows, [None, pa.py_buffer(bytes(bits))])


def _csv_line_numbers(rows: int, first: int, skipped: set[int]) -> list[int]:
    numbers, line = [], first
    for _ in range(rows):
        while line in skipped:
            line += 1
        numbers.append(line)
        line += 1
    return numbers


def _csv_raw(strings: pa.Table, row: int, fmt: CsvFormat) -> str:
    out = io.StringIO()
    values = ["" if strings.column(c)[row].as_py() is None else strings.column(c)[row].as_py()
              for c in strings.column_names]
    csv.writer(out, delimiter=fmt.delimiter, quotechar=fmt.quote, lineterminator="").writerow(values)
    return out.getvalue()


def _first_line(data: bytes) -> str:
    return data.split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")


def _type_name(data_type: pa.DataType) -> str:
    names = {pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INT", pa.int64(): "BIGINT",
             pa.float32(): "FLOAT", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN", pa.date32(): "DATE"}
    if pa.types.is_timestamp(data_type):
        return "TIMESTAMP"
    if pa.types.is_decimal(data_type):
        return f"DECIMAL({data_type.precision},{data_type.scale})"
    return names.get(data_type, str(data_type).upper())


# ---- Kafka messages: one record per message -------------------------------------------------


@dataclass(frozen=True)
class ParsedMessages:
    """The records of a run of messages: ``table`` holds those that conform, in order;
    ``kept`` their indices among the messages; ``rejected`` every other index with the reason."""

    table: pa.Table
    kept: list[int]
    rejected: dict[int, str]


def parse_messages(values: list[bytes | None], schema: pa.Schema, value_format: str,
                   csv_format: CsvFormat = CsvFormat(header=False)) -> ParsedMessages:
    """One record of ``schema`` per message value: a JSON object (``json``) or one CSV
    record without a header (``csv``). Like the file parsers, a function of the values
    alone, so a replayed batch rejects the same messages with the same reasons."""
    rejected: dict[int, str] = {}
    candidates: list[int] = []
    lines: list[bytes] = []
    for index, value in enumerate(values):
        problem, line = _message_line(value, value_format)
        if problem is not None:
            rejected[index] = problem
        else:
            candidates.append(index)
            lines.append(line)
    parse = _MESSAGE_PARSERS[value_format]
    parsed = parse(b"\n".join(lines) + b"\n" if lines else b"", schema, csv_format)
    numbered = all(r.line is not None and 1 <= r.line <= len(lines) for r in parsed.rejected)
    if numbered and parsed.table.num_rows + len(parsed.rejected) == len(lines):
        bad = {r.line - 1: r.error for r in parsed.rejected if r.line is not None}
        rejected |= {candidates[i]: error for i, error in bad.items()}
        kept = [index for i, index in enumerate(candidates) if i not in bad]
        return ParsedMessages(parsed.table, kept, dict(sorted(rejected.items())))
    # A message that read as several records (two JSON objects, say) put the whole run out
    # of step: each message on its own then, where exactly one record is accepted.
    tables, kept = [], []
    for index, line in zip(candidates, lines, strict=True):
        alone = parse(line + b"\n", schema, csv_format)
        records = alone.table.num_rows + len(alone.rejected)
        if alone.rejected:
            rejected[index] = alone.rejected[0].error
        elif records != 1:
            rejected[index] = f"holds {records} records; a message must hold one"
        else:
            tables.append(alone.table)
            kept.append(index)
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return ParsedMessages(table, kept, dict(sorted(rejected.items())))


def _message_line(value: bytes | None, value_format: str) -> tuple[str | None, bytes]:
    """The message as one line for the parser, or why it cannot be a record."""
    if value is None:
        return "the message has no value (a tombstone)", b""
    if not value.strip():
        return "the message's value is empty", b""
    if value_format == "json":
        # Outside strings, JSON's line breaks are whitespace, and inside them they must be
        # escaped: as spaces they change nothing, and each message is one line.
        return None, value.replace(b"\r", b" ").replace(b"\n", b" ")
    line = value.removesuffix(b"\n").removesuffix(b"\r")
    if b"\n" in line or b"\r" in line:
        return "a CSV message must hold one record on one line", b""
    return None, line


def _json_messages(data: bytes, schema: pa.Schema, _: CsvFormat) -> Parsed:
    return parse_jsonlines(data, schema)


def _csv_messages(data: bytes, schema: pa.Schema, csv_format: CsvFormat) -> Parsed:
    return parse_csv(data, schema, CsvFormat(header=False, delimiter=csv_format.delimiter, quote=csv_format.quote))


_MESSAGE_PARSERS: dict[str, Callable[[bytes, pa.Schema, CsvFormat], Parsed]] = {
    "json": _json_messages, "csv": _csv_messages,
}
