"""The file sources (a folder of CSV or JSON-lines files), planned on the driver and read
in Spark's tasks (spark_app.runtime.sources.planned).

Planning runs on the driver: ``latestOffset`` lists the input folder and admits new
files to the durable ``FileIndex``; offsets are ``{"source": persistent_id, "files": N}``
and Spark keeps them in its offset log. A batch is bounded (``Limits``: files and bytes
per trigger), so a backlog after an outage drains in several batches instead of one that
does not fit in memory and, its offsets being logged, fails again at every restart.
The reader learns where its query stands from Spark itself: on a restart, Spark hands it
the last logged offset before anything else (its AcceptsLatestSeenOffset); a reader that
was not told is a new query's, which starts at the first file (Spark asks for
``initialOffset`` only after the first ``latestOffset``).

Reading runs in Spark tasks: each task parses its files with ``parsing``, a block of
lines at a time (a file is never held whole), and writes what it sets aside to the
dead-letter location, one object per input file, so that re-reading a file rewrites the
same dead letters. A file is read up to the size it had when it was admitted, so a
replay reads the same bytes; one that vanished, shrank or grew since is recorded there
too (a ``file`` record) and counted, and the batch goes on. A file is also read in the
format its source had when it was admitted (the index records it), so a source whose
format changed (JSON lines, then CSV) replays an old batch as it first read it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from spark_app.persistence import Backend
from spark_app.runtime.sources.base import Offset
from spark_app.runtime.sources.dead_letters import count_dead_letters, write_dead_letters
from spark_app.runtime.sources.inputs import InputLocation
from spark_app.runtime.sources.parsing import CsvFormat, Parsed, parse_csv, parse_jsonlines
from spark_app.runtime.sources.reader import CountingReader
from spark_app.state.file_index import FileIndex
from spark_app.storage import FileEntry, NotFound, RetryPolicy, Storage

BLOCK_BYTES = 16 << 20
"""How much of a file a task parses at once (cut at a line's end)."""


@dataclass(frozen=True)
class Limits:
    """How much input one batch of a file source takes."""

    max_files_per_trigger: int = 1000
    max_bytes_per_trigger: int = 128 << 20
    """Sized for a 2 GiB driver in local mode: Spark spills what its operators hold, and
    the outputs stream their batch to storage."""

    @classmethod
    def from_options(cls, options: dict[str, str], defaults: dict[str, Any]) -> Limits:
        def pick(name: str) -> int:
            value = int(options.get(name) or defaults.get(name) or getattr(cls(), name))
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
            return value

        return cls(pick("max_files_per_trigger"), pick("max_bytes_per_trigger"))


@dataclass(frozen=True)
class ReadPlan:
    """What a task needs to read its files; pickled into each partition."""

    persistent_id: str
    format: str
    input: InputLocation
    dead_letter: Backend
    csv: CsvFormat
    arrow_schema: pa.Schema
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """How long unreachable storage is retried: the driver's outage budget."""

    def read_as(self) -> str:
        """How this plan reads a file (format and parse options), as the file index records it
        for each file admitted."""
        how: dict[str, Any] = {"format": self.format}
        if self.format == "csv":
            how["csv"] = asdict(self.csv)
        return json.dumps(how, sort_keys=True)

    def as_admitted(self, read_as: str | None) -> ReadPlan:
        """This plan, reading as the file's source read when the file was admitted (as now
        when the index recorded nothing)."""
        if read_as is None or read_as == self.read_as():
            return self
        how = json.loads(read_as)
        return replace(self, format=how["format"], csv=CsvFormat(**how.get("csv", {})))


@dataclass(frozen=True)
class FilesPartition:
    """Files of one batch that one task reads (spark_app.runtime.sources.planned)."""

    plan: ReadPlan
    files: tuple[FileEntry, ...]
    read_as: tuple[str | None, ...]
    """How each of ``files`` was to be read when it was admitted (ReadPlan.read_as)."""

    def read(self) -> Iterator[pa.RecordBatch]:
        return read_files(self.plan, self.files, self.read_as)


class FileStreamReader(CountingReader):
    unit = "files"

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        super().__init__(options)
        self._parallelism = max(1, int(options.get("parallelism", "2")))
        self._limits = Limits.from_options(options, self._context.get("limits", {}))
        self._compact_after = int(self._context.get("limits", {}).get("index_compact_after") or 0)
        self._plan = ReadPlan(
            persistent_id=self._pid,
            format=options["format"],
            input=InputLocation(Backend.from_json(json.loads(options["input"])), options.get("pattern", "*"),
                                self._retry),
            dead_letter=Backend.from_json(self._context["dead_letter"]),
            csv=CsvFormat(
                header=options.get("header", "true") == "true",
                delimiter=options.get("delimiter", ","),
                quote=options.get("quote", '"'),
            ),
            arrow_schema=to_arrow_schema(schema),
            retry=self._retry,
        )

    @cached_property
    def _index(self) -> FileIndex:
        return FileIndex(self._snapshot.storage(self._retry), self._pid, self._compact_after)

    def latestOffset(self) -> dict[str, Any]:
        admitted = self._index.admit(self._plan.input.list(), self._plan.read_as())
        end = self._index.bounded_end(self.planned, admitted, self._limits.max_files_per_trigger,
                                      self._limits.max_bytes_per_trigger)
        return self.offset(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[FilesPartition]:
        first, last = self.plan_range(start, end)
        files = self._index.files(first, last)
        read_as = dict(zip((f.path for f in files), self._index.read_as(first, last), strict=True))
        return [FilesPartition(self._plan, group, tuple(read_as[f.path] for f in group))
                for group in _balance(files, self._parallelism)]


def read_files(source_plan: ReadPlan, files: Sequence[FileEntry],
               read_as: Sequence[str | None]) -> Iterator[pa.RecordBatch]:
    """The rows of ``files``, each read as its ``read_as`` says (as ``source_plan`` reads
    now where it says nothing); rows that do not parse go to the dead letters."""
    dead_letters = source_plan.dead_letter.storage(source_plan.retry)
    for entry, how in zip(files, read_as, strict=True):
        plan = source_plan.as_admitted(how)
        set_aside: list[dict[str, Any]] = []
        for first_line, data in _blocks(plan, entry, set_aside):
            parsed = _parse(plan, data, first_line)
            set_aside += [{"kind": "row", **r.to_json()} for r in parsed.rejected]
            yield from parsed.table.to_batches(max_chunksize=65_536)
        if set_aside:
            write_dead_letters(dead_letters, plan.persistent_id, entry.path,
                               [{"file": entry.path, **r} for r in set_aside])


def _blocks(plan: ReadPlan, entry: FileEntry, set_aside: list[dict[str, Any]]) -> Iterator[tuple[int, bytes]]:
    """The file's bytes as it was admitted (``entry.size``), a block of whole lines at a
    time, each with the file line number of its first data line (a CSV header is repeated
    at the head of every block). What changed since admission goes to ``set_aside``."""
    header = b""
    has_header = plan.format == "csv" and plan.csv.header
    position, line = 0, 1
    while position < entry.size:
        end = min(position + BLOCK_BYTES, entry.size)
        last = end == entry.size
        try:
            # The last read asks for one byte more: getting it means the file grew.
            data = plan.input.read_range(entry.path, position, end + 1 if last else end)
        except NotFound:
            set_aside.append(_file_problem(
                "the file was deleted after it was admitted" + (
                    f"; {position} of its {entry.size} bytes were read" if position else "; nothing of it was read")))
            return
        if last and len(data) > end - position:
            data = data[: end - position]
            set_aside.append(_file_problem(f"the file grew after it was admitted; its first {entry.size} bytes "
                                           "(its size then) were read"))
        elif len(data) < end - position:
            set_aside.append(_file_problem(f"the file is shorter than when it was admitted ({entry.size} bytes); "
                                           f"the {position + len(data)} bytes left were read"))
            last = True
        if not last:
            cut = data.rfind(b"\n")
            if cut < 0:  # one line longer than a block: take it whole with the next read
                data += plan.input.read_range(entry.path, end, _line_end(plan, entry, end))
                cut = len(data) - 1
            data = data[: cut + 1]
        position += len(data)
        if has_header and line == 1:
            split = data.find(b"\n") + 1 or len(data)
            header, data, line = data[:split], data[split:], 2
        first_line = line
        line += data.count(b"\n")
        yield first_line, header + data
        if last:
            return


def _line_end(plan: ReadPlan, entry: FileEntry, start: int) -> int:
    """Where the line running on at ``start`` ends (after its newline), or the file's end."""
    position = start
    while position < entry.size:
        chunk = plan.input.read_range(entry.path, position, min(position + BLOCK_BYTES, entry.size))
        if not chunk:
            break
        newline = chunk.find(b"\n")
        if newline >= 0:
            return position + newline + 1
        position += len(chunk)
    return entry.size


def _file_problem(error: str) -> dict[str, Any]:
    return {"kind": "file", "line": None, "raw": "", "error": error}


class FileTracker:
    """A file source in a query's commits: files read, rows and files set aside."""

    def __init__(self, snapshots: Storage, persistent_id: str, compact_after: int, dead_letter: Backend) -> None:
        self._pid = persistent_id
        self._index = FileIndex(snapshots, persistent_id, compact_after)
        self._dead_letter = dead_letter

    def caught_up(self, committed: Offset | None) -> bool:
        self._index.reload()
        return _files(committed) >= len(self._index)

    def unreadable(self, start: Offset | None, end: Offset) -> dict[str, int]:
        return {}  # what was admitted stays readable (a file that changed is counted as a file problem)

    def counters(self, previous: Mapping[str, int], start: Offset | None, end: Offset) -> dict[str, int]:
        first, last = _files(start), _files(end)
        files = self._index.files(first, last) if last > first else []
        set_aside = count_dead_letters(self._dead_letter, self._pid, [f.path for f in files])
        return {
            "files": last,
            "malformed": previous.get("malformed", 0) + set_aside.rows,
            "file_problems": previous.get("file_problems", 0) + set_aside.files,
        }

    def describe(self, offset: Offset) -> str:
        return f"{_files(offset)} files"


def _files(offset: Offset | None) -> int:
    return int(offset.get("files", 0)) if offset else 0


def _parse(plan: ReadPlan, data: bytes, first_line: int) -> Parsed:
    if plan.format == "csv":
        return parse_csv(data, plan.arrow_schema, plan.csv, first_line=first_line)
    return parse_jsonlines(data, plan.arrow_schema, first_line=first_line)


def _balance(files: Sequence[FileEntry], groups: int) -> list[tuple[FileEntry, ...]]:
    """Splits files into at most ``groups`` partitions of similar total size, keeping order."""
    if not files:
        return []
    bins: list[list[FileEntry]] = [[] for _ in range(min(groups, len(files)))]
    sizes = [0] * len(bins)
    for entry in sorted(files, key=lambda f: -f.size):
        smallest = sizes.index(min(sizes))
        bins[smallest].append(entry)
        sizes[smallest] += entry.size
    order = {f.path: i for i, f in enumerate(files)}
    return [tuple(sorted(b, key=lambda f: order[f.path])) for b in bins if b]


def input_option(backend: Backend) -> str:
    return json.dumps(backend.to_json(), sort_keys=True)
