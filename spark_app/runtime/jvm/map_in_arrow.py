"""``DataFrame.mapInArrow`` without pandas in the driver.

pyspark builds mapInArrow's function through ``pandas_udf``, which first checks pandas'
version by importing it: 0.3 to 0.4 s of a driver's declarations on the test machine, while
its JVM waits, for a module no part of a pipeline uses (the function takes and yields Arrow
record batches). The same function is built here by the step after that check
(``vectorized_udf``, which validates the function's type) and handed to the Dataset's
``mapInArrow`` as pyspark does (pyspark 4.1: the function's column, no barrier, no resource
profile). pyspark's numpy converters import pandas too; ``session.build_session`` replaces
them. ``functions.lit`` still imports it, through the same check for numpy, in a pipeline
that calls it (a shared table's publisher and readers do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.pandas.functions import vectorized_udf  # type: ignore[attr-defined]  # not in its stub
from pyspark.sql.types import StructType
from pyspark.util import PythonEvalType

ArrowFunction = Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def map_in_arrow(df: DataFrame, function: ArrowFunction, schema: StructType | str) -> DataFrame:
    """What ``df.mapInArrow(function, schema)`` returns."""
    udf = vectorized_udf(function, schema, PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[df[name] for name in df.columns])
    return DataFrame(df._jdf.mapInArrow(column._jc, False, None), df.sparkSession)
