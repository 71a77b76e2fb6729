"""What a publisher reports of its table (TableOutput.table_report): no Spark session."""

from __future__ import annotations

from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_app import contract
from spark_app.runtime.tables.publish import PublishOptions, TableOutput

SCHEMA = StructType([StructField("customer_id", StringType()), StructField("total", LongType())])


class _Compacted:
    """A compactor whose last round saw ``latest`` (after its own OPTIMIZE) and a frontier."""

    def __init__(self, latest: int, frontier: int) -> None:
        self.latest, self.frontier = latest, frontier

    def report(self) -> contract.TableReport:
        return contract.TableReport(version=self.latest, bytes=100, frontier=self.frontier, compacted_ms=1)


def table(version: int | None, compacted: _Compacted | None) -> TableOutput:
    output = TableOutput("customers", ["customer_id"], SCHEMA, PublishOptions())
    output._version, output._rows = version, 13
    output._compactor = compacted  # type: ignore[assignment]
    return output


def test_the_version_is_the_latest_including_a_compactions_own_after_the_last_batch() -> None:
    # Batch 3 made version 1; the compaction after it committed OPTIMIZE as version 2 and
    # set the frontier there: the table is at version 2, not 1 (below its own frontier).
    report = table(1, _Compacted(latest=2, frontier=2)).table_report()
    assert (report.version, report.frontier, report.rows) == (2, 2, 13)


def test_a_batch_after_the_last_compaction_is_the_latest() -> None:
    assert table(5, _Compacted(latest=4, frontier=4)).table_report().version == 5


def test_before_any_batch_or_compaction_there_is_no_version() -> None:
    assert table(None, None).table_report().version is None
