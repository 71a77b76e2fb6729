"""Shared tables in the operator: spec.inputs and spec.tables as parsed, a reader's
tables resolved from its publishers' resources (or why it waits), the reader Pending until
they can be read, the driver told where they are, and the publisher's tables in its
status, printer column and metrics."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pipeline_operator import builders
from pipeline_operator.errors import InvalidSpec
from pipeline_operator.lifecycle import Launch, next_action
from pipeline_operator.memory import Memory, bounded_tables
from pipeline_operator.metrics import Metrics
from pipeline_operator.policy import resolve_inputs
from pipeline_operator.spec import Input, InputBackfill, PublishedTable, TableReference, parse_spec
from pipeline_operator.status import read_memory, render
from ppl_factories import NOW, S3_SPEC, TUNABLES, observed, raw

from spark_app import contract

READ = {"persistentId": "customers", "table": {"pipeline": "orders", "name": "customers"}}


def reader(base: dict[str, Any] | None = None, namespace: str = "team", **changes: Any):  # type: ignore[no-untyped-def]
    return parse_spec(raw(base, **{"inputs": [READ], **changes}), namespace=namespace, name="tiers")


def publisher(namespace: str = "team", base: dict[str, Any] | None = None, *, tables: list[Any] | None = None,
              root: str = "pvc://state/team/orders", version: int | None = 7) -> dict[str, Any]:
    status: dict[str, Any] = {"persistence": {"root": root}}
    if version is not None:
        status["tables"] = {"customers": {"version": version}}
    return {"metadata": {"namespace": namespace, "name": "orders"},
            "spec": raw(base, tables=tables if tables is not None else [{"name": "customers"}]), "status": status}


def test_inputs_and_tables_are_parsed_with_their_defaults() -> None:
    spec = reader(tables=[{"name": "tiers", "readers": ["analytics"], "maxHoldAgeSeconds": 3600}])
    assert spec.inputs == (Input("customers", table=TableReference("team", "orders", "customers")),)
    assert spec.tables == (PublishedTable("tiers", ("analytics",), 3600),)
    # A backfill's rate sits beside the table in one entry (issue 22's live setting), or alone.
    both = parse_spec(raw(inputs=[{**READ, "backfill": {"rowsPerSecond": 10}}, {"persistentId": "big"}]),
                      namespace="team", name="x")
    assert both.inputs == (Input("customers", InputBackfill(10), TableReference("team", "orders", "customers")),
                           Input("big"))
    assert both.table_inputs == ((both.inputs[0], both.inputs[0].table),)


@pytest.mark.parametrize(("changes", "field"), [
    ({"inputs": [{"table": {"pipeline": "orders", "name": "customers"}}]}, "spec.inputs[0].persistentId"),
    ({"inputs": [READ, READ]}, "spec.inputs[1].persistentId"),
    ({"inputs": [{"persistentId": "c", "table": {"name": "customers"}}]}, "spec.inputs[0].table.pipeline"),
    ({"inputs": [{"persistentId": "c", "table": {"pipeline": "Orders!", "name": "c"}}]},
     "spec.inputs[0].table.pipeline"),
    ({"inputs": {"persistentId": "c"}}, "spec.inputs"),
    ({"tables": [{"name": "a/b"}]}, "spec.tables[0].name"),
    ({"tables": [{"name": "t", "maxHoldAgeSeconds": 5}]}, "spec.tables[0].maxHoldAgeSeconds"),
    ({"tables": [{"name": "t", "readers": "ns"}]}, "spec.tables[0].readers"),
])
def test_a_bad_input_or_table_names_its_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        parse_spec(raw(**changes), namespace="team", name="x")
    assert field in [p.field for p in raised.value.problems]


def test_a_table_is_resolved_where_the_driver_reaches_it() -> None:
    resolved = resolve_inputs(reader(), {("team", "orders"): publisher()})
    assert resolved.waiting == ()
    assert resolved.tables == (contract.TableInput(
        table="team/orders/customers", uri="/var/lib/spark-app/state/team/orders/tables/customers"),)
    s3 = resolve_inputs(reader(S3_SPEC, namespace="analytics", inputs=[
        {**READ, "table": {**READ["table"], "namespace": "team"}}]), {("team", "orders"): publisher(
            "team", S3_SPEC, tables=[{"name": "customers", "readers": ["analytics"]}],
            root="s3://pipelines/team/orders")})
    assert s3.waiting == ()
    assert s3.tables[0].uri == "s3://pipelines/team/orders/tables/customers"
    assert s3.tables[0].s3.endpoint == "http://127.0.0.1:9000" and s3.tables[0].credentials == ""


@pytest.mark.parametrize(("found", "says"), [
    (None, "PersistentPipeline team/orders does not exist (yet)"),
    ("the operator may not read PersistentPipelines in namespace team (403)",
     "PersistentPipeline team/orders cannot be read: the operator may not read"),
    (publisher(tables=[]), "does not publish a table 'customers'"),
    (publisher(version=None), "no version yet"),
    (publisher(root=""), "no version yet"),
    (publisher(base=raw(persistence={"filesystem": {"claimName": "other"}})), "claim other"),
])
def test_a_table_that_cannot_be_read_yet_says_why(found: dict[str, Any] | None, says: str) -> None:
    resolved = resolve_inputs(reader(), {("team", "orders"): found})
    assert resolved.tables == ()
    assert len(resolved.waiting) == 1 and resolved.waiting[0].startswith("spec.inputs[0].table team/orders/customers: ")
    assert says in resolved.waiting[0]


def test_another_namespace_reads_only_what_it_is_granted() -> None:
    mine = reader(S3_SPEC, namespace="analytics",
                  inputs=[{**READ, "table": {**READ["table"], "namespace": "team"}}])
    closed = publisher("team", S3_SPEC, root="s3://pipelines/team/orders")
    waiting = resolve_inputs(mine, {("team", "orders"): closed}).waiting
    assert waiting and "does not grant namespace analytics" in waiting[0]
    for readers in (["analytics"], ["*"]):
        granted = publisher("team", S3_SPEC, tables=[{"name": "customers", "readers": readers}],
                            root="s3://pipelines/team/orders")
        assert resolve_inputs(mine, {("team", "orders"): granted}).waiting == ()


def test_a_reader_waits_pending_with_a_condition_then_launches_once_its_table_is_there() -> None:
    spec = reader()
    waiting = resolve_inputs(spec, {("team", "orders"): None}).waiting
    first = next_action(observed(spec, waiting=waiting), TUNABLES)
    assert first.action is None and first.memory.phase == "Pending"
    assert [(e.type, e.reason) for e in first.events] == [("Normal", "WaitingForTable")]
    progressing = next(c for c in first.memory.conditions if c.type == "Progressing")
    assert (progressing.status, progressing.reason) == ("False", "WaitingForTable")
    assert "team/orders/customers" in progressing.message
    assert first.requeue_after == TUNABLES.recheck_seconds  # rechecked: it starts by itself
    assert next_action(observed(spec, first.memory, waiting=waiting), TUNABLES).events == ()  # announced once
    ready = next_action(observed(spec, first.memory), TUNABLES)
    assert isinstance(ready.action, Launch)


def test_the_driver_is_told_its_tables_and_the_publishers_settings_never_credentials() -> None:
    spec = reader(tables=[{"name": "tiers", "maxHoldAgeSeconds": 600}])
    tables = resolve_inputs(spec, {("team", "orders"): publisher()}).tables
    pod = builders.driver_pod(spec, epoch=1, state_root="pvc://state/team/tiers", owner={}, tables=tables)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    environment = contract.DriverEnvironment.from_env({k: v for k, v in env.items() if v is not None})
    assert environment.table_inputs == tables
    assert environment.tables == {"tiers": contract.TableSettings(max_hold_age_seconds=600)}
    # Which tables it reads shapes the pod: a change relaunches it; none leaves the hash as it was.
    assert spec.pod_hash != reader(tables=[]).pod_hash
    rated = reader(inputs=[{**READ, "backfill": {"rowsPerSecond": 5}}], tables=[{"name": "tiers",
                                                                                "maxHoldAgeSeconds": 600}])
    assert rated.pod_hash == spec.pod_hash  # a backfill's rate is a live setting: no restart
    plain = parse_spec(raw(), namespace="team", name="tiers")
    assert plain.pod_hash == parse_spec(raw(inputs=[]), namespace="team", name="tiers").pod_hash


def test_a_shared_tables_backfill_rate_reaches_its_driver_beside_the_tables_location() -> None:
    """sa.io.tables.read(..., backfill=True) is steered as sa.io.delta.read is: the entry
    that names the table carries the rate, which lands in the live settings the driver's
    planner of that persistent id reads (the pod's annotation), not in its hash."""
    spec = reader(inputs=[{**READ, "backfill": {"rowsPerSecond": 250}}])
    tables = resolve_inputs(spec, {("team", "orders"): publisher()}).tables
    pod = builders.driver_pod(spec, epoch=1, state_root="pvc://state/team/tiers", owner={}, tables=tables)
    live = contract.LiveSettings.from_json(pod["metadata"]["annotations"][contract.LIVE_SETTINGS_ANNOTATION])
    assert live.backfill_rates == {"customers": 250}
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    environment = contract.DriverEnvironment.from_env({k: v for k, v in env.items() if v is not None})
    assert [t.table for t in environment.table_inputs] == ["team/orders/customers"]
    paused = reader(inputs=[{**READ, "backfill": {"rowsPerSecond": 0}}])
    assert paused.live_settings.backfill_rates == {"customers": 0} and paused.pod_hash == spec.pod_hash


def _table(*behind: int) -> contract.TableReport:
    return contract.TableReport(version=42, rows=12, bytes=4096, frontier=40, compacted_ms=int(NOW * 1000), holders=tuple(
        contract.HolderReport(reader=f"team/r{n}/customers", kind="changelog", version=42 - b, behind=b,
                              age_s=float(b), blocking=b == max(behind)) for n, b in enumerate(behind)))


def test_a_publishers_tables_go_from_its_report_to_its_status_column_and_metrics() -> None:
    from ppl_factories import driver
    from ppl_factories import spec as make_spec

    s = make_spec()
    d = driver(s, report=contract.DriverReport(epoch=1, stored_epoch=0, state="running", reported_at=NOW - 2,
                                               tables={"customers": _table(0, 3)}))
    decision = next_action(observed(s, Memory(epoch=1, driver_uid=d.uid, state_root="pvc://state/team/wc"),
                                    driver=d), TUNABLES)
    assert decision.memory.tables == bounded_tables({"customers": _table(0, 3)})  # furthest behind first
    status = render(decision.memory, name="wc", generation=1, previous={}, now=NOW)
    assert status["tablesSummary"] == "customers v42 2 readers (1 behind by 3)"
    assert status["tables"]["customers"]["holders"][0] == {
        "reader": "team/r1/customers", "kind": "changelog", "version": 39, "behind": 3, "ageSeconds": 3.0,
        "broken": False, "blocking": True}
    assert read_memory(json.loads(json.dumps(status))).tables == decision.memory.tables
    metrics = Metrics()
    metrics.tables("team", "wc", decision.memory.tables)
    labels = {"namespace": "team", "pipeline": "wc", "table": "customers"}
    assert metrics.registry.get_sample_value("persistent_pipeline_table_version", labels) == 42
    assert metrics.registry.get_sample_value("persistent_pipeline_table_holder_lag_versions",
                                             {**labels, "reader": "team/r1/customers"}) == 3
    metrics.forget("team", "wc")
    assert metrics.registry.get_sample_value("persistent_pipeline_table_version", labels) is None


def test_the_status_keeps_the_furthest_behind_holders_only() -> None:
    many = bounded_tables({"t": _table(*range(50))})
    assert [h.behind for h in many["t"].holders] == list(range(49, 29, -1))


TABLES = (contract.TableInput(table="team/orders/customers", uri="/var/lib/spark-app/state/team/orders/tables/customers"),)


@pytest.mark.parametrize("on_delete", ["Retain", "Delete"])
def test_a_deleted_reader_releases_its_holds_before_its_finalizer_goes(on_delete: str) -> None:
    from pipeline_operator.lifecycle import CreateCleanup, Release
    from test_operator_podsecurity import restricted_violations

    spec = reader(persistence={"filesystem": {"claimName": "state"}, "onDelete": on_delete})
    memory = Memory(state_root="pvc://state/team/tiers")
    first = next_action(observed(spec, memory, deleting=True), TUNABLES)
    assert isinstance(first.action, CreateCleanup) and "releasing its holds" in first.memory.message
    assert isinstance(next_action(observed(spec, memory, deleting=True, cleanup_phase="Running"), TUNABLES).action,
                      type(None))
    done = next_action(observed(spec, memory, deleting=True, cleanup_phase="Succeeded"), TUNABLES)
    assert isinstance(done.action, Release) and "released its holds" in done.memory.message
    pod = builders.cleanup_pod(spec, owner={}, tables=TABLES)["spec"]
    assert restricted_violations(pod) == []
    steps = [*pod.get("initContainers", []), *pod["containers"]]
    assert [c["args"][3:] for c in steps] == [["tables", "release", "--reader", "team/tiers"]] + (
        [["reset", "/var/lib/spark-app/state/team/tiers", "--yes"]] if on_delete == "Delete" else [])
    env = {e["name"]: e.get("value") for e in steps[0]["env"]}
    assert contract.table_inputs_from_env({contract.TABLE_INPUTS: env[contract.TABLE_INPUTS]}) == TABLES


def test_a_deleted_pipeline_without_tables_to_release_keeps_its_state_at_once() -> None:
    from pipeline_operator.lifecycle import Release

    decision = next_action(observed(parse_spec(raw(), namespace="team", name="x"), Memory(), deleting=True),
                           TUNABLES)
    assert isinstance(decision.action, Release)


def test_a_reader_created_before_its_publisher_waits_then_launches_with_the_tables_location() -> None:
    from pipeline_operator.errors import Refused
    from pipeline_operator.reconcile import Reconciler
    from pipeline_operator.settings import Settings
    from test_operator_reconcile import FakeKube

    class Cluster(FakeKube):
        def __init__(self, spec: dict[str, Any]) -> None:
            super().__init__(spec)
            self.publishers: dict[tuple[str, str], dict[str, Any] | None] = {}
            self.forbidden: set[str] = set()

        def get_pipeline(self, namespace: str, name: str) -> dict[str, Any] | None:
            if (namespace, name) == ("team", "wc"):
                return super().get_pipeline(namespace, name)
            if namespace in self.forbidden:
                raise Refused(403, "forbidden")
            return self.publishers.get((namespace, name))

    kube = Cluster(raw(inputs=[READ, {**READ, "persistentId": "far", "table": {**READ["table"], "namespace": "x"}}]))
    kube.forbidden.add("x")
    reconciler = Reconciler(kube, Settings(), Metrics(), clock=lambda: NOW)  # type: ignore[arg-type]
    outcome = reconciler.reconcile("team", "wc")
    assert kube.resource is not None and kube.resource["status"]["phase"] == "Pending"
    message = kube.resource["status"]["message"]
    assert "spec.inputs[0].table team/orders/customers: PersistentPipeline team/orders does not exist" in message
    assert "spec.inputs[1].table x/orders/customers: PersistentPipeline x/orders cannot be read" in message
    assert [e.reason for e in outcome.events] == ["WaitingForTable"] and kube.pods == {}
    # The publisher appears and commits a version; the other namespace's grant too.
    kube.publishers[("team", "orders")] = publisher()
    kube.forbidden.clear()
    kube.publishers[("x", "orders")] = publisher("x", tables=[{"name": "customers", "readers": ["team"]}],
                                                 root="pvc://state/x/orders")
    reconciler.reconcile("team", "wc")
    # A claim is per namespace: the same claim name in x is another volume.
    assert "claim state of namespace x" in kube.resource["status"]["message"] and kube.pods == {}
    kube.publishers[("x", "orders")] = publisher("x", S3_SPEC, tables=[{"name": "customers", "readers": ["team"]}],
                                                 root="s3://pipelines/x/orders")
    reconciler.reconcile("team", "wc")
    pod = kube.pods["wc-driver"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    tables = contract.table_inputs_from_env({contract.TABLE_INPUTS: env[contract.TABLE_INPUTS]})
    assert [(t.table, t.uri) for t in tables] == [
        ("team/orders/customers", "/var/lib/spark-app/state/team/orders/tables/customers"),
        ("x/orders/customers", "s3://pipelines/x/orders/tables/customers")]
