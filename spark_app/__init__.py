"""spark_app: streaming PySpark pipelines that resume from their last snapshot.

    import spark_app as sa

    words = sa.io.csv.read("inputs/", schema="word STRING", persistent_id="words_source")
    word_counts = words.groupBy("word").count()
    sa.io.jsonlines.write(word_counts, "result.jsonlines")
    sa.run(persistence_config=sa.persistence.Config.simple_config(
        sa.persistence.Backend.filesystem("./state/")))

The package is layered (import contracts in pyproject.toml, checked by make lint):
``contract`` (what the operator injects and the driver reads; standard library only),
``storage`` (backends), ``persistence`` (where state lives, opened as a storage),
``state`` (the metadata log, leases, file indexes), ``runtime`` (Spark), and this
user-facing API. Everything below ``runtime`` imports without pyspark, so that
``spark_app reset`` runs without a JVM; the operator imports ``contract`` alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_app import io, persistence
    from spark_app.api import iterate, run
    from spark_app.runtime.iterate.declare import IterateResult
    from spark_app.runtime.iterate.engine import Delta

__all__ = ["Delta", "IterateResult", "io", "iterate", "persistence", "run"]


def __getattr__(name: str) -> Any:
    # Everything loads on first use, so that importing spark_app.contract (the operator
    # does, and nothing else of spark_app) loads no other module of the package.
    if name == "persistence":
        return importlib.import_module("spark_app.persistence")
    if name == "io":
        return importlib.import_module("spark_app.io")
    if name in ("run", "iterate"):
        return getattr(importlib.import_module("spark_app.api"), name)
    if name == "Delta":
        return importlib.import_module("spark_app.runtime.iterate.engine").Delta
    if name == "IterateResult":
        return importlib.import_module("spark_app.runtime.iterate.declare").IterateResult
    raise AttributeError(f"module 'spark_app' has no attribute {name!r}")
