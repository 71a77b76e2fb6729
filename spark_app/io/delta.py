"""Delta Lake tables: a keyed table read as a changelog, or an output maintained exactly once."""

from __future__ import annotations

from pyspark.sql import DataFrame

from spark_app.runtime.pipeline import current
from spark_app.runtime.sources.delta_table import BackfillSettings


def read(
    path: str,
    *,
    key: list[str],
    persistent_id: str | None = None,
    chunk_rows: int = 100_000,
    rows_per_second: float | None = None,
    max_plans_per_trigger: int = 1,
) -> DataFrame:
    """A streaming DataFrame of the keyed Delta table at ``path`` as a changelog: its
    columns plus ``diff`` (+1 a row appears, -1 it goes; an update is -old +new).

    The table's current rows are read first, in ``key`` order, ``chunk_rows`` at a time
    (the backfill), while its changes keep flowing for the keys already read; then only
    its changes follow. A batch takes one chunk and the changes since the last (at most
    ``max_plans_per_trigger`` of them), and where the backfill stands commits with the
    batch: a restarted driver carries on where it was, re-reading at most one batch.
    ``rows_per_second`` limits the backfill (0 pauses it; changes to the rows already read
    still flow); the operator can change it while the pipeline runs. The table must
    record its changes (``delta.enableChangeDataFeed = true``), and its versions must
    stay until the reader has read past them: vacuum it no sooner than the reader lags.
    """
    settings = BackfillSettings(chunk_rows=chunk_rows, rows_per_second=rows_per_second,
                                max_plans_per_trigger=max_plans_per_trigger)
    return current().add_table_source(path, tuple(key), persistent_id, settings)


def write(
    df: DataFrame,
    path: str,
    *,
    name: str | None = None,
    key: list[str] | None = None,
    change_data_feed: bool = True,
) -> None:
    """Maintains ``df`` as the Delta table at ``path`` (a folder or s3a://…), exactly once.

    Rows of an append-only query are appended; the result of an aggregation is kept as one
    current row per key (MERGE). With ``change_data_feed`` the table records its changes,
    which ``spark.read.option("readChangeFeed", "true")`` returns.
    """
    current().add_output("delta", df, path, name, key, change_data_feed=change_data_feed)
