"""The baseline: Delta's own change-data-feed stream, as a user writes it, on the same
table: its initial snapshot comes as the first batch, then the changes. It writes the
markers out like bench/backfill/reader.py.

    python bench/backfill/native.py TABLE OUT_DIR CHECKPOINT
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import functions as F  # noqa: E402

from bench.common import SPARK_CONF  # noqa: E402
from spark_app.persistence import Backend  # noqa: E402
from spark_app.runtime.jvm.conf import spark_conf  # noqa: E402
from spark_app.runtime.jvm.session import build_session  # noqa: E402

MARKER_BASE = 10**15

table, out, checkpoint = sys.argv[1:4]
spark = build_session(spark_conf(Backend.filesystem(checkpoint), 10_000, SPARK_CONF))
changes = spark.readStream.format("delta").option("readChangeFeed", "true").load(table)
markers = (changes.where(F.col("_change_type").isin("insert", "update_postimage") & (F.col("value") >= MARKER_BASE))
           .select("id", "value"))
(markers.writeStream.format("json").option("path", out).option("checkpointLocation", checkpoint + "/spark")
 .trigger(processingTime="200 milliseconds").start().awaitTermination())
