"""Where a shared table is, and how Spark and spark_app's storage reach it.

A table on S3 may be reached with settings (endpoint, path style) and credentials other
than the reader's own state: they are set on Hadoop's configuration for that bucket
alone (S3A's per-bucket options), in the JVM's memory, never in Spark's configuration,
arguments or logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pyspark.sql import SparkSession

from spark_app.contract import S3Keys
from spark_app.persistence import Backend
from spark_app.runtime.jvm.session import s3a_conf
from spark_app.state.tables import TableRef
from spark_app.storage import RetryPolicy, S3Location, Storage


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
        if self.folder.kind != "s3":
            return
        bucket = S3Location.parse(self.folder.root).bucket
        hadoop: Any = spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in s3a_conf(self.folder).items():
            hadoop.set(f"fs.s3a.bucket.{bucket}.{key.removeprefix('spark.hadoop.fs.s3a.')}", value)
        if self.keys is not None:
            provider = ("org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider" if self.keys.session_token
                        else "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider")
            hadoop.set(f"fs.s3a.bucket.{bucket}.aws.credentials.provider", provider)
            hadoop.set(f"fs.s3a.bucket.{bucket}.access.key", self.keys.access_key_id)
            hadoop.set(f"fs.s3a.bucket.{bucket}.secret.key", self.keys.secret_access_key)
            if self.keys.session_token:
                hadoop.set(f"fs.s3a.bucket.{bucket}.session.token", self.keys.session_token)
