"""A persistent id names one input of a pipeline, whatever its kind: a lookup of a shared
table is not a stream source, yet its version is committed under its id, so a stream of
the same id (a file, Kafka or backfilled Delta source) would share that offset."""

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
