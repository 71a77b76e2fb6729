"""JSON lines: a folder of input files, or an output changelog file."""

from __future__ import annotations

from pyspark.sql import DataFrame

from spark_app.io.csv import _limits
from spark_app.runtime.pipeline import FeedsOutputs, current


def read(path: str, *, schema: str, persistent_id: str | None = None, pattern: str = "*",
         max_files_per_trigger: int | None = None, max_bytes_per_trigger: int | None = None) -> DataFrame:
    """A streaming DataFrame of the objects, one per line, of every file under ``path``.

    Fields are matched by name; missing fields are null, extra fields are ignored. A line
    that is not a JSON object of the schema's types is set aside in the dead-letter
    location with its error. See ``spark_app.io.csv.read`` for ``persistent_id`` and the
    batch bounds.
    """
    options = {"pattern": pattern, **_limits(max_files_per_trigger, max_bytes_per_trigger)}
    return current().add_source("jsonlines", path, schema, persistent_id, options)


def write(df: DataFrame | FeedsOutputs, path: str, *, name: str | None = None, key: list[str] | None = None) -> None:
    """Writes the changelog of ``df`` to the file ``path``, exactly once.

    Each line holds a row's columns plus ``time`` (the batch's time in ms) and ``diff``:
    +1 for a row that appears, -1 for a row that goes. For an aggregation, an updated group
    gives -1 of its old row and +1 of its new one. ``key`` overrides the key inferred from
    the aggregation. ``name`` identifies the output in the stored state (default: the
    file name).
    """
    current().add_output("jsonlines", df, path, name, key)
