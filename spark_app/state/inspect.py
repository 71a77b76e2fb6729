"""What ``spark_app inspect`` reports about a pipeline's stored state.

Reads only the metadata log, the lease and (optionally) sizes; needs neither Spark nor
the pipeline's code. ``spark_app inspect --json`` prints the JSON form for scripts, so its
keys are a contract: add keys, do not rename them. (The operator reads none of this: a
PersistentPipeline's status holds the driver's own reports, spark_app.contract.)
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from spark_app.contract import S3Keys
from spark_app.persistence import Backend
from spark_app.state.compaction import hold_age
from spark_app.state.delta_log import TableLog
from spark_app.state.log import PREFIX as LOG_PREFIX
from spark_app.state.log import LogCorrupted, LogEntry, MetadataLog
from spark_app.state.records import heads_from_record
from spark_app.state.repair import plan_repair
from spark_app.state.session import LeaseDamaged, read_lease
from spark_app.state.tables import TABLES, HoldRegistry
from spark_app.storage import ScopedStorage, Storage


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
    tables = inspect_tables(snapshots or metadata, now_ms=now_ms)
    if tables:
        report["tables"] = tables
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
    if report.get("tables"):
        lines.append(describe_tables(report["tables"], indent="  "))
    return "\n".join([*lines, *_damage_lines(report)])


def inspect_tables(root: Storage, now_ms: int | None = None) -> dict[str, Any]:
    """The shared tables a state root publishes (``tables/<name>``): the versions their
    logs hold, their checkpoints, the last compaction's frontier, and every reader's hold
    with how far behind it is. ``spark_app tables --json`` prints it: add keys, do not
    rename them."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    names = sorted({key.split("/")[1] for key in root.list(f"{TABLES}/") if key.count("/") >= 2})
    tables: dict[str, Any] = {}
    for name in names:
        storage = ScopedStorage(root, f"{TABLES}/{name}")
        log = TableLog(storage)
        keys = log.keys()
        versions = log.versions(keys)
        if not versions:
            continue
        registry = HoldRegistry(storage)
        frontier = registry.frontier()
        holds = []
        for hold in sorted(registry.holds(), key=lambda h: str(h.reader)):
            age = hold_age(hold, versions[-1], log.timestamp_ms, now_ms)
            broken = registry.broken(hold.reader)
            holds.append({"reader": str(hold.reader), "kind": hold.kind, "version": hold.version,
                          "behind": age.behind, "age_s": None if age.age_ms is None else round(age.age_ms / 1000, 1),
                          "updated_s_ago": round((now_ms - hold.updated_ms) / 1000, 1),
                          "broken": broken.reason if broken is not None and broken.state_id == hold.state_id
                          else None})
        tables[name] = {
            "uri": storage.root_uri,
            "versions": {"first": versions[0], "latest": versions[-1], "count": len(versions)},
            "checkpoints": log.checkpoints(keys),
            "frontier": frontier.to_json() if frontier else None,
            "holds": holds,
        }
    return tables


def describe_tables(tables: Mapping[str, Any], indent: str = "") -> str:
    if not tables:
        return f"{indent}no shared tables"
    lines = []
    for name, table in tables.items():
        versions = table["versions"]
        frontier = table["frontier"]
        lines.append(f"{indent}table {name} at {table['uri']}: versions {versions['first']} to {versions['latest']} "
                     f"in the log, checkpoints {table['checkpoints'] or 'none'}"
                     + (f", compaction frontier {frontier['version']}" if frontier else ""))
        for hold in table["holds"]:
            state = f"BROKEN: {hold['broken']}" if hold["broken"] else (
                "current" if not hold["behind"] else f"{hold['behind']} versions behind for {hold['age_s']}s")
            lines.append(f"{indent}  hold of {hold['reader']} ({hold['kind']}): version {hold['version']}, {state}, "
                         f"updated {hold['updated_s_ago']}s ago")
        if not table["holds"]:
            lines.append(f"{indent}  no reader holds a version")
    return "\n".join(lines)


def release_holds(folders: Sequence[Backend], reader: str, keys: Mapping[str, S3Keys | None]) -> list[str]:
    """Drops every hold of ``reader`` (namespace/pipeline) on the tables in ``folders``: its
    PersistentPipeline was deleted, and what it held may go at the next compaction."""
    namespace, _, pipeline = reader.partition("/")
    done = []
    for folder in folders:
        registry = HoldRegistry(folder.storage(keys=keys.get(folder.root)))
        released = 0
        for hold in registry.holds():
            if (hold.reader.namespace, hold.reader.pipeline) == (namespace, pipeline):
                registry.release(hold.reader)
                registry.clear_broken(hold.reader)
                released += 1
                done.append(f"released the hold of {hold.reader} on {folder.root} (version {hold.version})")
        if not released:
            done.append(f"{reader} held nothing on {folder.root}")
    return done


def _damage_lines(report: dict[str, Any]) -> list[str]:
    return [f"  DAMAGED {d['key']}: {d['problem']}; "
            + (f"`python -m spark_app repair` would {d['repair']}" if d["safe"] else d["repair"])
            for d in report.get("damage", [])]
