"""What a pipeline's declarations decide before Spark runs anything: a persistent id names
one input whatever its kind (a lookup of a shared table is not a stream source, yet its
version is committed under its id, so a stream of the same id, file, Kafka or backfilled
Delta, would share that offset); where malformed input goes when no output is a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_app import contract
from spark_app.persistence import Backend
from spark_app.runtime.pipeline import Pipeline, PipelineError
from spark_app.runtime.tables.location import TableLocation
from spark_app.runtime.tables.readers import TableInput
from spark_app.state.tables import LOOKUP, TableRef


@pytest.mark.parametrize("fmt", ["csv", "kafka", "delta"])
def test_a_source_may_not_take_a_table_inputs_persistent_id(tmp_path: Path, fmt: str) -> None:
    pipeline = Pipeline(contract.DriverEnvironment(injected=None))
    where = TableLocation(TableRef.parse("orders/customers", "shop"), Backend.filesystem(str(tmp_path)))
    pipeline.shared["customers"] = TableInput("customers", LOOKUP, where)
    with pytest.raises(PipelineError, match="'customers' is used by a table input"):
        pipeline._source_id(fmt, "words", "customers")
    assert pipeline._source_id(fmt, "words", "words") == "words"


def test_a_publisher_of_tables_only_keeps_its_dead_letters_with_its_state() -> None:
    """A published table has no path of its own until it recovers (it lives in the state):
    beside it meant '.dead-letter' in the driver's working folder. With no file output the
    driver keeps them under the state (None here), as it does for Kafka-only pipelines."""
    from pyspark.sql.types import LongType, StructField, StructType

    from spark_app.runtime.pipeline import QuerySpec
    from spark_app.runtime.plan import PlanFacts
    from spark_app.runtime.sinks.base import SingleSink
    from spark_app.runtime.sinks.jsonlines import JsonLinesOutput
    from spark_app.runtime.tables.publish import PublishOptions, TableOutput

    pipeline = Pipeline(contract.DriverEnvironment(injected=None))
    schema = StructType([StructField("customer_id", LongType()), StructField("total", LongType())])
    table = TableOutput("customers", ["customer_id"], schema, PublishOptions())
    pipeline.add_query("customers", QuerySpec(SingleSink(table), None, PlanFacts((), ("customer_id",))))
    assert pipeline.default_dead_letter() is None
    changes = JsonLinesOutput("changes", "/data/changes.jsonlines", None)
    pipeline.add_query("changes", QuerySpec(SingleSink(changes), None, PlanFacts((), None)))
    assert pipeline.default_dead_letter() == "/data/changes.jsonlines.dead-letter"
