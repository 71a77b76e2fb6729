"""Where a shared table is, and how Spark and spark_app's storage reach it.

A table on S3 may be reached with settings (endpoint, path style) and credentials other
than the reader's own state: they are set on Hadoop's configuration for that bucket
alone (S3A's per-bucket options), in the JVM's memory, never in Spark's configuration,
arguments or logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from pyspark.sql import SparkSession

from spark_app.contract import S3Keys
from spark_app.persistence import Backend
from spark_app.runtime.jvm.session import reach_bucket
from spark_app.state.tables import TableRef
from spark_app.storage import RetryPolicy, Storage


def hadoop_uri(uri: str) -> str:
    """A URI as Hadoop writes it (``file:/x``, where Python writes ``file:///x``): Delta
    compares a table's location with the one it qualifies itself."""
    return "file:" + uri.removeprefix("file://") if uri.startswith("file:///") else uri


@dataclass(frozen=True)
class TableLocation:
    ref: TableRef
    folder: Backend
    """The table's own folder (``<publisher's state root>/tables/<name>``)."""
    keys: S3Keys | None = field(default=None, repr=False)
    """The table's own S3 credentials, if it is not reached as the driver's own state is."""

    @cached_property
    def storage(self) -> Storage:
        return self.folder.storage(RetryPolicy(deadline_s=120), keys=self.keys)

    @property
    def uri(self) -> str:
        """The table as Spark reads it."""
        return hadoop_uri(self.storage.spark_uri(""))

    def configure(self, spark: SparkSession) -> None:
        """Lets Spark reach the table's bucket (nothing to do for a folder)."""
        reach_bucket(spark, self.folder, self.keys)
