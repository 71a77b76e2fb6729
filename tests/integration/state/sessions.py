"""Drivers' sessions on stored state, for the state layer's tests: a clock that tests move,
a manifest, a head, a session opened at an epoch."""

from __future__ import annotations

from spark_app.state.identity import Manifest, QueryIdentity, SourceIdentity
from spark_app.state.records import OutputHead, QueryHead
from spark_app.state.session import Holder, StateSession
from spark_app.storage import Storage


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def manifest(key: tuple[str, ...] = ("word",), sources: tuple[str, ...] = ("words",)) -> Manifest:
    return Manifest(
        sources={pid: SourceIdentity(pid, "csv", "struct<word:string>", "/in") for pid in sources},
        queries={"out": QueryIdentity("out", sources, ("Aggregate(keys=[word: string], functions=[count(1)])",), key)},
    )


def head(batch: int) -> QueryHead:
    return QueryHead(batch=batch, batch_time_ms=batch, commit_time_ms=batch, offsets={"words": {"files": batch + 1}},
                     outputs={"out": OutputHead(position=10 * batch, rows=batch)})


def open_session(storage: Storage, clock: Clock, epoch: int | None = None, m: Manifest | None = None) -> StateSession:
    return StateSession.open(storage, m or manifest(), holder=Holder.this_process("test"), requested_epoch=epoch,
                             clock=clock)
