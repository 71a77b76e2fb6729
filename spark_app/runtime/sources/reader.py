"""What spark_app's own stream readers (the file sources, the backfilled table) share.

Each reader plans a source's batches on the driver (spark_app.runtime.sources.planned);
its offset counts units of its source: ``{"source": persistent_id, "files": N}`` or
``{"source": persistent_id, "plans": N}``. Naming the source in the offset is what lets a
reader refuse another source's offset when a query's sources were reordered. Its
planning state (the file index, the plan store, with their storage clients) stays on the
driver: each partition it plans carries what a task needs to read it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import pyarrow as pa

from spark_app.persistence import Backend
from spark_app.storage import RetryPolicy


class SourceOrderChanged(Exception):
    """Spark handed this source another source's offset: the query's sources were reordered."""


def read_context(path: str) -> dict[str, Any]:
    """The settings ``spark_app.run`` writes before it starts a query."""
    try:
        with open(path) as handle:
            context: dict[str, Any] = json.load(handle)
            return context
    except FileNotFoundError:
        raise RuntimeError(
            "spark_app sources only run under spark_app.run(): start the pipeline with sa.run(...) "
            "rather than starting Spark streaming queries by hand"
        ) from None


def retry_policy(context: Mapping[str, Any]) -> RetryPolicy:
    """The driver's outage budget, for a source's own storage calls: past it, the batch fails,
    the driver exits with EXIT_STORAGE_UNAVAILABLE and is relaunched once storage is back,
    rather than looking healthy while it retries for the default 15 minutes."""
    budget = context.get("outage_budget_s")
    return RetryPolicy() if budget is None else RetryPolicy(deadline_s=float(budget))


@runtime_checkable
class ReadsItself(Protocol):
    """An input partition of a reader: what a task reads, pickled into the batch's plan."""

    def read(self) -> Iterator[pa.RecordBatch]: ...


class CountingReader(ABC):
    """A reader whose offset is how many ``unit`` of its source the query has planned."""

    unit: ClassVar[str]

    def __init__(self, options: Mapping[str, str]) -> None:
        self._context = read_context(options["context"])
        self._pid = options["persistent_id"]
        self._snapshot = Backend.from_json(self._context["snapshot"])
        self._retry = retry_policy(self._context)
        self._position: int | None = None
        """Where the query's next batch starts: the end of the last batch Spark planned."""

    def offset(self, count: int) -> dict[str, Any]:
        return {"source": self._pid, self.unit: count}

    @property
    def planned(self) -> int:
        """How many units the batches planned so far took."""
        return self._position or 0

    def initialOffset(self) -> dict[str, Any]:
        self._position = 0
        return self.offset(0)

    def plan_range(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> tuple[int, int]:
        """The units of a batch Spark plans from ``start`` to ``end``, both this source's;
        the next batch starts at ``end``."""
        for offset in (start, end):
            if offset.get("source") != self._pid:
                raise SourceOrderChanged(
                    f"source {self._pid!r} was given the offset of source {offset.get('source')!r}: the "
                    "query's sources were reordered or replaced since its state was written"
                )
        self._position = int(end[self.unit])
        return int(start[self.unit]), self._position

    @abstractmethod
    def latestOffset(self) -> dict[str, Any]:  # noqa: N802 - Spark's name for it
        """Where the next batch would end: what is available, within the reader's limits."""

    @abstractmethod
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[ReadsItself]:
        """The batch from ``start`` to ``end`` (``plan_range``), as the partitions tasks read."""
