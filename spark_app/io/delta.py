"""A Delta Lake table output."""

from __future__ import annotations

from pyspark.sql import DataFrame

from spark_app.runtime.pipeline import current


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
