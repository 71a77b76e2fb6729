"""The resource's status, both ways: ``read_memory`` turns it into the decision function's
Memory, ``render`` turns a Memory back into the status to write. Only bounded fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline_operator import names
from pipeline_operator.memory import (
    Checkpoint,
    Condition,
    Failure,
    Halt,
    Memory,
    Restart,
    describe_tables,
    truncate,
)
from pipeline_operator.observe import BackfillReport, QueryReport, format_time, parse_time
from spark_app.contract import HolderReport, TableReport

JsonDict = dict[str, Any]


def render(memory: Memory, *, name: str, generation: int, previous: Mapping[str, Any], now: float) -> JsonDict:
    """The full status for ``memory``. Conditions keep their lastTransitionTime while their
    status stays the same, as Kubernetes conventions ask."""
    m = memory
    status: JsonDict = {
        "phase": m.phase,
        "message": m.message,
        "observedGeneration": generation,
        "conditions": _conditions(m.conditions, previous.get("conditions") or [], generation, now),
        "driver": {"epoch": m.epoch, **({"pod": names.driver_pod_name(name), "uid": m.driver_uid}
                                        if m.driver_uid else {})},
        "restarts": {
            "total": m.restarts_total,
            "consecutiveFailures": m.consecutive_failures,
            "recent": [{"time": format_time(r.time), "reason": r.reason, "epoch": r.epoch}
                       for r in m.recent_restarts],
        },
        "persistence": {"root": m.state_root, "resetNonce": m.reset_nonce,
                        "statelessGeneration": m.stateless_generation, "appliedHash": m.applied_hash},
        "bookkeeping": {"endedUid": m.ended_uid, "epochFloor": m.epoch_floor, "stopping": m.stopping,
                        "announcedEpoch": m.announced_epoch, "announcedProblem": m.announced_problem,
                        "degraded": m.degraded, "storageOutages": m.storage_outages,
                        **({"runningSince": format_time(m.running_since)} if m.running_since else {}),
                        **({"backfillSeenAt": format_time(m.backfill_seen_at)} if m.backfill_seen_at else {})},
    }
    if m.last_failure:
        f = m.last_failure
        status["lastFailure"] = {"reason": f.reason, "message": f.message, "time": format_time(f.time),
                                 "epoch": f.epoch, "podUid": f.pod_uid, "generation": f.generation,
                                 **({"exitCode": f.exit_code} if f.exit_code is not None else {})}
    if m.next_launch_at is not None:
        status["nextLaunch"] = {"at": format_time(m.next_launch_at), "reason": m.next_launch_reason}
    if m.halt:
        status["halt"] = {"reason": m.halt.reason, "generation": m.halt.generation,
                          "restartNonce": m.halt.restart_nonce}
    if m.checkpoint:
        c = m.checkpoint
        lags = [r.total_lag for r in c.queries.values() if r.total_lag is not None]
        status["checkpoint"] = {
            "epoch": c.epoch,
            **({"time": format_time(c.time)} if c.time is not None else {}),
            # The slowest output's: each output reads its sources on its own.
            **({"lag": max(lags)} if lags else {}),
            "queries": {q: {"batch": r.batch, "offsets": dict(r.offsets), "backlog": r.backlog,
                            "malformed": r.malformed,
                            **({"lag": {pid: dict(topics) for pid, topics in r.lag.items()}} if r.lag else {}),
                            **({"commitTime": format_time(r.commit_time_ms / 1000)} if r.commit_time_ms else {}),
                            **({"iterate": r.iterate} if r.iterate is not None else {})}
                        for q, r in c.queries.items()},
        }
    if m.backfills:
        status["backfill"] = m.describe_backfills()
        status["backfills"] = {pid: {"rowsRead": b.rows_read, "rowsTotal": b.rows_total, "percent": b.percent,
                                     "rowsPerSecond": b.rows_per_second, "etaSeconds": b.eta_seconds,
                                     "paused": b.paused, "finished": b.finished, "version": b.version}
                               for pid, b in m.backfills.items()}
    if m.tables:
        status["tables"] = {name: _render_table(t) for name, t in m.tables.items()}
        status["tablesSummary"] = describe_tables(m.tables)
    bounded: JsonDict = _bounded(status)
    return bounded


def _render_table(t: TableReport) -> JsonDict:
    """A published table in the status: latest version, rows, bytes, compaction frontier,
    and each holder with its version, lag and whether it blocks compaction."""
    return {
        "version": t.version, "rows": t.rows, "bytes": t.bytes, "compactionFrontier": t.frontier,
        **({"compactedAt": format_time(t.compacted_ms / 1000)} if t.compacted_ms else {}),
        "holders": [{"reader": h.reader, "kind": h.kind, "version": h.version, "behind": h.behind,
                     **({"ageSeconds": h.age_s} if h.age_s is not None else {}),
                     "broken": h.broken, "blocking": h.blocking} for h in t.holders],
    }


def _read_table(raw: Mapping[str, Any]) -> TableReport:
    compacted = parse_time(raw.get("compactedAt"))
    return TableReport(
        version=raw.get("version"), rows=raw.get("rows"), bytes=raw.get("bytes"), frontier=raw.get("compactionFrontier"),
        compacted_ms=int(compacted * 1000) if compacted is not None else None,
        holders=tuple(HolderReport(reader=str(h.get("reader", "")), kind=str(h.get("kind", "")),
                                   version=int(h.get("version") or 0), behind=int(h.get("behind") or 0),
                                   age_s=h.get("ageSeconds"), broken=bool(h.get("broken")),
                                   blocking=bool(h.get("blocking")))
                      for h in raw.get("holders") or []))


def read_memory(status: Mapping[str, Any] | None) -> Memory:
    s = status or {}
    driver, restarts = s.get("driver") or {}, s.get("restarts") or {}
    persistence, books = s.get("persistence") or {}, s.get("bookkeeping") or {}
    failure, launch, halt, checkpoint = s.get("lastFailure"), s.get("nextLaunch"), s.get("halt"), s.get("checkpoint")
    return Memory(
        phase=s.get("phase", ""),
        message=s.get("message", ""),
        epoch=int(driver.get("epoch") or 0),
        driver_uid=driver.get("uid") or "",
        restarts_total=int(restarts.get("total") or 0),
        consecutive_failures=int(restarts.get("consecutiveFailures") or 0),
        recent_restarts=tuple(Restart(parse_time(r["time"]) or 0.0, r.get("reason", ""), int(r.get("epoch") or 0))
                              for r in restarts.get("recent") or []),
        last_failure=Failure(
            reason=failure.get("reason", ""), exit_code=failure.get("exitCode"), message=failure.get("message", ""),
            time=parse_time(failure.get("time")) or 0.0, epoch=int(failure.get("epoch") or 0),
            pod_uid=failure.get("podUid", ""), generation=int(failure.get("generation") or 0),
        ) if failure else None,
        ended_uid=books.get("endedUid", ""),
        next_launch_at=parse_time(launch["at"]) if launch else None,
        next_launch_reason=(launch or {}).get("reason", ""),
        epoch_floor=int(books.get("epochFloor") or 0),
        halt=Halt(halt.get("reason", ""), int(halt.get("generation") or 0), halt.get("restartNonce", ""))
        if halt else None,
        stopping=books.get("stopping", ""),
        state_root=persistence.get("root", ""),
        reset_nonce=persistence.get("resetNonce", ""),
        stateless_generation=int(persistence.get("statelessGeneration") or 0),
        applied_hash=persistence.get("appliedHash", ""),
        checkpoint=_read_checkpoint(checkpoint) if checkpoint else None,
        announced_epoch=int(books.get("announcedEpoch") or 0),
        running_since=parse_time(books["runningSince"]) if books.get("runningSince") else None,
        announced_problem=books.get("announcedProblem", ""),
        degraded=books.get("degraded", ""),
        storage_outages=int(books.get("storageOutages") or 0),
        conditions=tuple(Condition(c["type"], c["status"], c.get("reason", ""), c.get("message", ""))
                         for c in s.get("conditions") or []),
        backfills={pid: _read_backfill(b) for pid, b in (s.get("backfills") or {}).items()},
        backfill_seen_at=parse_time(books.get("backfillSeenAt")),
        tables={str(name): _read_table(t) for name, t in (s.get("tables") or {}).items()},
    )


def _read_backfill(raw: Mapping[str, Any]) -> BackfillReport:
    return BackfillReport(rows_read=int(raw.get("rowsRead") or 0), rows_total=int(raw.get("rowsTotal") or 0),
                          percent=float(raw.get("percent") or 0.0), rows_per_second=raw.get("rowsPerSecond"),
                          eta_seconds=raw.get("etaSeconds"), paused=bool(raw.get("paused")),
                          finished=bool(raw.get("finished")), version=raw.get("version"))


def _bounded(value: Any) -> Any:
    """Every string of the status cut to MAX_MESSAGE_CHARS, keys too (a query's name comes
    from the driver): whatever a driver or a spec holds, the status stays bounded."""
    if isinstance(value, dict):
        return {truncate(k): _bounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bounded(v) for v in value]
    return truncate(value) if isinstance(value, str) else value


def _read_checkpoint(raw: Mapping[str, Any]) -> Checkpoint:
    queries = {
        name: QueryReport(
            batch=q.get("batch"),
            commit_time_ms=_milliseconds(parse_time(q.get("commitTime"))),
            offsets=q.get("offsets") or {}, backlog=bool(q.get("backlog")), malformed=int(q.get("malformed") or 0),
            iterate=q.get("iterate"), lag=_lag(q.get("lag")),
        )
        for name, q in (raw.get("queries") or {}).items()
    }
    return Checkpoint(time=parse_time(raw["time"]) if raw.get("time") else None, epoch=int(raw.get("epoch") or 0),
                      queries=queries)


def _lag(raw: Any) -> dict[str, dict[str, dict[str, int]]]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(pid): {str(t): {str(p): int(n) for p, n in parts.items()} for t, parts in topics.items()}
            for pid, topics in raw.items() if isinstance(topics, Mapping)}


def _milliseconds(seconds: float | None) -> int | None:
    return int(seconds * 1000) if seconds is not None else None


def _conditions(conditions: tuple[Condition, ...], previous: list[Mapping[str, Any]], generation: int,
                now: float) -> list[JsonDict]:
    before = {c.get("type"): c for c in previous}
    rendered = []
    for c in conditions:
        old = before.get(c.type) or {}
        since = old.get("lastTransitionTime") if old.get("status") == c.status else None
        rendered.append({"type": c.type, "status": c.status, "reason": c.reason, "message": c.message,
                         "observedGeneration": generation,
                         "lastTransitionTime": since or format_time(now, fraction=False)})
    return rendered

