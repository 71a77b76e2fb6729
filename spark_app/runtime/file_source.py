"""The file sources (a folder of CSV or JSON-lines files), as a Spark Python data source.

Planning runs on the driver: ``latestOffset`` lists the input folder and admits new
files to the durable ``FileIndex``; offsets are ``{"source": persistent_id, "files": N}``
and Spark keeps them in its offset log. Reading runs in Spark tasks: each task parses
its files with ``parsing`` and writes the rows it rejects to the dead-letter location,
one object per input file, so that re-reading a file rewrites the same dead letters.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from spark_app.persistence import Backend
from spark_app.runtime.inputs import InputLocation
from spark_app.runtime.parsing import CsvFormat, Parsed, parse_csv, parse_jsonlines
from spark_app.state.file_index import FileIndex
from spark_app.storage import FileEntry, join

FORMAT_NAME = "spark_app_files"


class SourceOrderChanged(Exception):
    """Spark handed this source another source's offset: the query's sources were reordered."""


@dataclass(frozen=True)
class ReadPlan:
    """What a task needs to read its files; pickled into each partition."""

    persistent_id: str
    format: str
    input: InputLocation
    dead_letter: Backend
    csv: CsvFormat
    arrow_schema: pa.Schema


@dataclass(frozen=True)
class FilesPartition(InputPartition):  # type: ignore[misc]
    plan: ReadPlan
    files: tuple[FileEntry, ...]


def dead_letter_key(persistent_id: str, file_path: str) -> str:
    return join(persistent_id, f"{file_path}.jsonl")


def read_context(path: str) -> dict[str, Any]:
    """The settings ``spark_app.run`` writes before it starts a query."""
    try:
        with open(path) as handle:
            context: dict[str, Any] = json.load(handle)
            return context
    except FileNotFoundError:
        raise RuntimeError(
            "spark_app sources only run under spark_app.run(): start the pipeline with sa.run(...) "
            "rather than starting Spark streaming queries by hand"
        ) from None


class FileSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FileStreamReader(self.options, schema)


class FileStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        # Runs in a Python process of Spark's: its storage retries should be logged like the driver's.
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        context = read_context(options["context"])
        self._pid = options["persistent_id"]
        self._parallelism = max(1, int(options.get("parallelism", "2")))
        self._snapshot = Backend(**context["snapshot"])
        self._index_cache: FileIndex | None = None
        self._plan = ReadPlan(
            persistent_id=self._pid,
            format=options["format"],
            input=InputLocation(Backend(**json.loads(options["input"])), options.get("pattern", "*")),
            dead_letter=Backend(**context["dead_letter"]),
            csv=CsvFormat(
                header=options.get("header", "true") == "true",
                delimiter=options.get("delimiter", ","),
                quote=options.get("quote", '"'),
            ),
            arrow_schema=to_arrow_schema(schema),
        )

    @property
    def _index(self) -> FileIndex:
        if self._index_cache is None:
            self._index_cache = FileIndex(self._snapshot.storage(), self._pid)
        return self._index_cache

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to ship ``read`` to tasks, which need only the partition:
        # the index (and its storage client) stays on the driver.
        return {**self.__dict__, "_index_cache": None}

    def initialOffset(self) -> dict[str, Any]:
        return {"source": self._pid, "files": 0}

    def latestOffset(self) -> dict[str, Any]:
        return {"source": self._pid, "files": self._index.admit(self._plan.input.list())}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        for offset in (start, end):
            if offset.get("source") != self._pid:
                raise SourceOrderChanged(
                    f"source {self._pid!r} was given the offset of source {offset.get('source')!r}: the "
                    "query's sources were reordered or replaced since its state was written"
                )
        files = self._index.files(int(start["files"]), int(end["files"]))
        return [FilesPartition(self._plan, group) for group in _balance(files, self._parallelism)]

    def read(self, partition: FilesPartition) -> Iterator[pa.RecordBatch]:
        return read_files(partition.plan, partition.files)

    def commit(self, end: dict[str, Any]) -> None:
        pass


def read_files(plan: ReadPlan, files: Sequence[FileEntry]) -> Iterator[pa.RecordBatch]:
    dead_letters = plan.dead_letter.storage()
    for entry in files:
        parsed = _parse(plan, plan.input.read(entry.path))
        if parsed.rejected:
            lines = [
                json.dumps({"source": plan.persistent_id, "file": entry.path, **r.to_json()}, sort_keys=True)
                for r in parsed.rejected
            ]
            dead_letters.write(dead_letter_key(plan.persistent_id, entry.path), ("\n".join(lines) + "\n").encode())
        yield from parsed.table.to_batches(max_chunksize=65_536)


def count_dead_letters(dead_letter: Backend, persistent_id: str, files: Sequence[FileEntry]) -> int:
    """How many rows of ``files`` were set aside (read back from the dead-letter objects)."""
    storage = dead_letter.storage()
    existing = set(storage.list(persistent_id + "/"))
    total = 0
    for entry in files:
        key = dead_letter_key(persistent_id, entry.path)
        if key in existing:
            total += storage.read(key).count(b"\n")
    return total


def _parse(plan: ReadPlan, data: bytes) -> Parsed:
    if plan.format == "csv":
        return parse_csv(data, plan.arrow_schema, plan.csv)
    return parse_jsonlines(data, plan.arrow_schema)


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
    return json.dumps(asdict(backend), sort_keys=True)
