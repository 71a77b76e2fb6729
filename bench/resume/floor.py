"""The floor of any driver's start, for `make bench-resume`: a new process builds the
SparkSession spark_app builds (the same jars, class archive, Python launcher and
settings) and runs one micro-batch of a one-row file to an output file, with no state and
no persistence. A resumed driver cannot show its first new row sooner than this."""

import argparse
import json
import os
import sys
from pathlib import Path

# The checkout this script is in, not whichever spark_app is installed: a benchmark run from
# an older checkout measures that checkout's code (Python puts the script's folder first).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import DataFrame  # noqa: E402

from spark_app import contract  # noqa: E402
from spark_app.persistence import Backend  # noqa: E402
from spark_app.runtime.jvm.conf import spark_conf  # noqa: E402
from spark_app.runtime.jvm.session import build_session  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--input", required=True)
parser.add_argument("--output", required=True)
args = parser.parse_args()

extra = json.loads(os.environ.get(contract.SPARK_CONF, "{}"))  # as a driver gets it from the benchmark
spark = build_session(spark_conf(Backend.from_uri(args.output + ".state"), 10_000, extra))


def write(df: DataFrame, batch_id: int) -> None:
    with open(args.output, "a") as out:
        for row in df.collect():
            out.write(json.dumps(row.asDict()) + "\n")


query = (spark.readStream.format("csv").option("header", "true").schema("key STRING").load(args.input)
         .writeStream.foreachBatch(write).option("checkpointLocation", args.output + ".checkpoint")
         .trigger(availableNow=True).start())
query.awaitTermination()
