"""Connectors: where a pipeline reads from and writes to.

    words = sa.io.csv.read("inputs/", schema="word STRING", persistent_id="words_source")
    sa.io.jsonlines.write(words.groupBy("word").count(), "result.jsonlines")
"""

from spark_app.io import csv, delta, jsonlines, kafka, tables

__all__ = ["csv", "delta", "jsonlines", "kafka", "tables"]
