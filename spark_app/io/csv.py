"""A folder of CSV files, polled continuously; new files are picked up as they appear."""

from __future__ import annotations

from pyspark.sql import DataFrame

from spark_app.runtime.pipeline import current


def read(
    path: str,
    *,
    schema: str,
    persistent_id: str | None = None,
    header: bool = True,
    delimiter: str = ",",
    quote: str = '"',
    pattern: str = "*",
    max_files_per_trigger: int | None = None,
    max_bytes_per_trigger: int | None = None,
) -> DataFrame:
    """A streaming DataFrame of the rows of every CSV file under ``path`` (a folder or s3://…).

    ``schema`` is a Spark DDL string ("word STRING, n INT"); with ``header`` the columns are
    matched by name. Rows that do not fit the schema are set aside in the dead-letter
    location with their error and counted; the pipeline goes on. ``persistent_id`` names the
    source in the stored state: keep it stable across code changes. Files are read once
    each, in order of arrival; write them under a temporary name (``.x`` or ``x.tmp``) and
    rename them into place so that no half-written file is read. A batch reads at most
    ``max_files_per_trigger`` files and ``max_bytes_per_trigger`` bytes (by default 1,000
    files and 128 MiB, or what the PersistentPipeline sets), so a backlog drains in several
    batches; a file larger than the bound is read alone, a block at a time.
    """
    options = {"header": str(header).lower(), "delimiter": delimiter, "quote": quote, "pattern": pattern,
               **_limits(max_files_per_trigger, max_bytes_per_trigger)}
    return current().add_source("csv", path, schema, persistent_id, options)


def _limits(max_files: int | None, max_bytes: int | None) -> dict[str, str]:
    given = {"max_files_per_trigger": max_files, "max_bytes_per_trigger": max_bytes}
    return {name: str(value) for name, value in given.items() if value is not None}
