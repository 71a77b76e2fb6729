"""What the per-batch commit asks of a source besides its offsets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

Offset = Mapping[str, Any]
"""A source's offset as Spark logs it (JSON)."""


class Tracker(Protocol):
    """One source as the commit of one query sees it."""

    def caught_up(self, committed: Offset | None) -> bool:
        """Whether the query, having committed ``committed``, has read all the input there is now."""

    def unreadable(self, start: Offset | None, end: Offset) -> dict[str, int]:
        """Before a batch read from ``start`` to ``end`` is written: what of its input the
        source can no longer read and skips, as counters the commit adds to the source's
        (a Kafka source: ``{"lost": 8}`` for offsets retention removed); raises, saying
        what is missing, where the source may not skip it."""

    def counters(self, previous: Mapping[str, int], start: Offset | None, end: Offset) -> dict[str, int]:
        """The source's counters in the commit of a batch read from ``start`` to ``end``
        (what it set aside, how far it got), from those of the commit before."""

    def describe(self, offset: Offset) -> str:
        """The offset as the driver's log says it after a commit (tests and people read it)."""
