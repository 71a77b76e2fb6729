"""What ``spark_app inspect`` reports about a pipeline's stored state.

Reads only the metadata log, the lease and (optionally) sizes; needs neither Spark nor
the pipeline's code. ``spark_app inspect --json`` prints the JSON form for scripts, so its
keys are a contract: add keys, do not rename them. (The operator reads none of this: a
PersistentPipeline's status holds the driver's own reports, spark_app.contract.)
"""

from __future__ import annotations

import time
from typing import Any

from spark_app.state.log import PREFIX as LOG_PREFIX
from spark_app.state.log import LogCorrupted, LogEntry, MetadataLog
from spark_app.state.records import heads_from_record
from spark_app.state.repair import plan_repair
from spark_app.state.session import LeaseDamaged, read_lease
from spark_app.storage import Storage


def inspect(metadata: Storage, snapshots: Storage | None = None, *, sizes: bool = False,
            now_ms: int | None = None) -> dict[str, Any]:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    damage = plan_repair(metadata, snapshots or metadata).damage
    latest = _newest_good(MetadataLog(metadata))
    try:
        lease = read_lease(metadata)
    except LeaseDamaged:
        lease = None
    report: dict[str, Any] = {
        "uri": metadata.root_uri,
        "exists": latest is not None,
        "epoch": int(latest.record["epoch"]) if latest else 0,
        "state_id": latest.record.get("state_id") if latest else None,
        "log": {"seq": latest.seq, "kind": latest.record["kind"], "time_ms": latest.record["time_ms"]}
        if latest else None,
        "lease": None,
        "queries": {},
        "damage": [{"key": d.key, "problem": d.problem, "repair": d.fix, "safe": d.safe} for d in damage],
    }
    if lease is not None:
        report["lease"] = {
            "epoch": lease.epoch,
            "holder": f"{lease.holder.describe()}",
            "renewed_ms": lease.renewed_ms,
            "age_s": round((now_ms - lease.renewed_ms) / 1000, 1),
            "live": lease.is_live(now_ms),
            "released": lease.released,
            "status": lease.status,
        }
    if latest is not None:
        for name, head in sorted(heads_from_record(latest.record).items()):
            report["queries"][name] = {
                **head.to_json(),
                "age_s": round((now_ms - head.commit_time_ms) / 1000, 1),
            }
    if sizes:
        store = snapshots or metadata
        report["sizes"] = {
            "metadata_log_bytes": metadata.size(LOG_PREFIX),
            "checkpoints_bytes": store.size("checkpoints/"),
            "operator_state_bytes": sum(
                store.size(k) for k in _state_prefixes(store, report["queries"])
            ),
            "output_snapshots_bytes": store.size("outputs/"),
            "source_indexes_bytes": store.size("sources/"),
            "iterate_bytes": store.size("iterate/"),
        }
    return report


def _newest_good(log: MetadataLog) -> LogEntry | None:
    for seq in reversed(log.sequence_numbers()):
        try:
            entry = log.entry(seq)
        except LogCorrupted:
            continue
        if entry is not None:
            return entry
    return None


def _state_prefixes(store: Storage, queries: dict[str, Any]) -> list[str]:
    return [f"checkpoints/{name}/state/" for name in queries]


def describe_iterate(meta: dict[str, Any]) -> str:
    runs = ", ".join(f"{mode} {count}" for mode, count in sorted(meta.get("runs", {}).items()))
    when = "at restart" if meta.get("at_restart") else "on new input"
    limit = "" if meta.get("converged") else " (stopped at the iteration limit)"
    rows = ", ".join(f"{name}: {count} rows" for name, count in sorted(meta.get("rows", {}).items()))
    return (f"iterate {meta.get('persistent_id')}: last run {meta.get('decision')} {when}, "
            f"{meta.get('iterations')} iterations in {meta.get('seconds')}s{limit} ({meta.get('reason')}); "
            f"{rows}; runs so far: {runs}")


def render(report: dict[str, Any]) -> str:
    """A human-readable summary of ``inspect``'s report."""
    if not report["exists"]:
        return "\n".join([f"{report['uri']}: no state yet (no driver has started on it)", *_damage_lines(report)])
    lines = [f"state at {report['uri']}", f"  epoch {report['epoch']}, metadata log entry {report['log']['seq']} "
             f"({report['log']['kind']})"]
    lease = report.get("lease")
    if lease:
        liveness = "released" if lease["released"] else ("live" if lease["live"] else "expired")
        lines.append(f"  lease: epoch {lease['epoch']}, {lease['holder']}, renewed {lease['age_s']}s ago ({liveness})")
    for name, query in report["queries"].items():
        lines.append(f"  output {name}: batch {query['batch']} committed {query['age_s']}s ago")
        for pid, offset in sorted(query["offsets"].items()):
            counters = query["sources"].get(pid, {})
            lines.append(f"    source {pid}: offset {offset}, malformed rows set aside: {counters.get('malformed', 0)}")
        for head in query["outputs"].values():
            snap = head.get("snapshot")
            snap_text = f", snapshot at batch {snap['batch']}" if snap else ""
            lines.append(f"    position {head['position']}, {head['rows']} changelog rows{snap_text}")
        if query.get("iterate"):
            lines.append("    " + describe_iterate(query["iterate"]))
    for key, value in report.get("sizes", {}).items():
        lines.append(f"  {key.replace('_', ' ')}: {value}")
    return "\n".join([*lines, *_damage_lines(report)])


def _damage_lines(report: dict[str, Any]) -> list[str]:
    return [f"  DAMAGED {d['key']}: {d['problem']}; "
            + (f"`python -m spark_app repair` would {d['repair']}" if d["safe"] else d["repair"])
            for d in report.get("damage", [])]
