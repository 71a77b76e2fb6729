"""Dead letters: what a source set aside, one object per origin (an input file, or a Kafka
message), under the source's persistent id.

An origin's object is written whole by the task that read it, from what the input held,
so a replayed batch or a retried task rewrites the same object: counting a batch's dead
letters reads back the objects of the batch's origins, which is exact whatever crashed.
A Kafka message is its own origin, named by its offset: the queries that read one source
(one per output) each cut a partition's offsets into batches their own way, so named by
the first offset a task read, one query's letters stayed beside another's.
Each line is a JSON object with ``source``, ``kind`` (``row``: a record that does not fit
the schema; ``file``: a file that changed after it was admitted), ``raw``, ``error`` and
where the record came from (``file`` and ``line``, or ``topic``, ``partition`` and ``offset``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from spark_app.persistence import Backend
from spark_app.storage import Storage, join


def dead_letter_key(persistent_id: str, origin: str) -> str:
    """Where the dead letters of ``origin`` (a relative name) go."""
    return join(persistent_id, f"{origin}.jsonl")


def kafka_origin(topic: str, partition: int, offset: int) -> str:
    """A Kafka message, named by its offset."""
    return f"{topic}/{partition}/{offset:020d}"


def write_dead_letters(storage: Storage, persistent_id: str, origin: str, records: list[dict[str, Any]]) -> None:
    lines = [json.dumps({"source": persistent_id, **r}, sort_keys=True) for r in records]
    storage.write(dead_letter_key(persistent_id, origin), ("\n".join(lines) + "\n").encode())


@dataclass(frozen=True)
class SetAside:
    """What a batch's origins left in the dead letters."""

    rows: int = 0
    """Malformed rows (or messages)."""
    files: int = 0
    """Files that vanished or changed after they were admitted."""

    def __add__(self, other: SetAside) -> SetAside:
        return SetAside(self.rows + other.rows, self.files + other.files)


def count_dead_letters(dead_letter: Backend, persistent_id: str, origins: Iterable[str]) -> SetAside:
    """What ``origins`` set aside, read back from their dead-letter objects."""
    storage = dead_letter.storage()
    existing = set(storage.list(persistent_id + "/"))
    rows = problems = 0
    for origin in origins:
        key = dead_letter_key(persistent_id, origin)
        if key in existing:
            for record in _records(storage, key):
                if record.get("kind") == "file":
                    problems += 1
                else:
                    rows += 1
    return SetAside(rows, problems)


def kafka_origins(dead_letter: Backend, persistent_id: str, topic: str, partition: int,
                  start: int, end: int) -> list[str]:
    """The messages of a partition in [start, end) that were set aside."""
    prefix = join(persistent_id, topic, str(partition)) + "/"
    found = []
    for key in dead_letter.storage().list(prefix):
        name = key[len(prefix):].removesuffix(".jsonl")
        if name.isdigit() and start <= int(name) < end:
            found.append(kafka_origin(topic, partition, int(name)))
    return found


def _records(storage: Storage, key: str) -> Iterator[dict[str, Any]]:
    for line in storage.read(key).splitlines():
        if line.strip():
            yield json.loads(line)
