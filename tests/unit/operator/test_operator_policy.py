"""The backoff, the state roots, and the health of a running driver."""

from __future__ import annotations

import pytest
from pipeline_operator.memory import Memory
from pipeline_operator.observe import QueryReport
from pipeline_operator.policy import RootRefused, StateRoot, assess, backoff_delay, state_root
from pipeline_operator.spec import Backoff, RestartPolicy
from ppl_factories import NOW, driver, report, spec


def test_the_backoff_doubles_from_the_initial_delay_up_to_the_cap() -> None:
    policy = RestartPolicy(backoff=Backoff(initial_seconds=10, max_seconds=100, multiplier=2, jitter=0))
    assert [backoff_delay(policy, n, "s") for n in range(1, 7)] == [10, 20, 40, 80, 100, 100]


def test_the_jitter_spreads_delays_within_its_fraction_and_is_repeatable() -> None:
    policy = RestartPolicy(backoff=Backoff(initial_seconds=100, max_seconds=1000, jitter=0.2))
    delays = [backoff_delay(policy, 1, f"pipeline-{i}") for i in range(200)]
    assert all(80 <= d <= 120 for d in delays) and max(delays) - min(delays) > 30
    assert backoff_delay(policy, 1, "same") == backoff_delay(policy, 1, "same")


def test_a_zero_initial_delay_relaunches_at_once() -> None:
    policy = RestartPolicy(backoff=Backoff(initial_seconds=0, max_seconds=0))
    assert backoff_delay(policy, 5, "s") == 0


@pytest.mark.parametrize(("changes", "memory", "launching", "expected"), [
    ({}, Memory(), True, StateRoot("pvc://state/team/wc", 0)),
    ({"persistence__filesystem__path": "custom/p"}, Memory(), True, StateRoot("pvc://state/custom/p", 0)),
    ({"persistence__resetNonce": "r2"}, Memory(state_root="pvc://state/team/wc"), True,
     StateRoot("pvc://state/team/wc/resets/r2", 0)),
    ({}, Memory(state_root="pvc://state/team/wc/generations/3", stateless_generation=3), False,
     StateRoot("pvc://state/team/wc/generations/3", 3)),
    ({"upgradeMode": "stateless"}, Memory(), True, StateRoot("pvc://state/team/wc/generations/1", 1)),
])
def test_state_roots(changes: dict[str, object], memory: Memory, launching: bool, expected: StateRoot) -> None:
    assert state_root(spec(**changes), memory, launching=launching) == expected


def test_a_new_base_without_a_new_reset_nonce_is_refused_under_last_state() -> None:
    refused = state_root(spec(persistence__filesystem__path="moved"), Memory(state_root="pvc://state/team/wc"),
                         launching=True)
    assert isinstance(refused, RootRefused) and "resetNonce" in refused.message
    stateless = spec(upgradeMode="stateless", persistence__filesystem__path="moved")
    assert isinstance(state_root(stateless, Memory(state_root="pvc://state/team/wc"), launching=True), StateRoot)


def test_health_windows_follow_the_spec() -> None:
    s = spec(persistence__snapshotIntervalSeconds=5, persistence__degradedAfterSeconds=10)
    fresh = QueryReport(batch=1, commit_time_ms=int((NOW - 9) * 1000), backlog=True)
    late = QueryReport(batch=1, commit_time_ms=int((NOW - 11) * 1000), backlog=True)
    assert assess(s, driver(s, report=report(q=fresh)), NOW, 60).checkpoint_status == "True"
    health = assess(s, driver(s, report=report(q=late)), NOW, 60)
    assert health.degraded_reason == "NoRecentCommit" and "2 snapshot intervals" in health.degraded_message
    never = QueryReport(backlog=True)
    assert assess(s, driver(s, started_at=NOW - 11, report=report(q=never)), NOW, 60).degraded_reason == "NoRecentCommit"
    assert assess(s, driver(s, started_at=NOW - 5, report=report(q=never)), NOW, 60).degraded_reason == ""


def test_a_starting_driver_has_no_checkpoint_health_yet() -> None:
    s = spec()
    health = assess(s, driver(s, report=report(state="starting")), NOW, 60)
    assert (health.checkpoint_status, health.checkpoint_reason, health.degraded_reason) == (
        "Unknown", "DriverStarting", "")


def _resource(namespace: str, name: str, created: str, raw_spec: dict) -> dict:  # type: ignore[type-arg]
    return {"metadata": {"namespace": namespace, "name": name, "creationTimestamp": created}, "spec": raw_spec}


def test_a_newer_pipeline_on_an_older_ones_state_root_is_refused_with_its_name() -> None:
    from pipeline_operator.policy import root_taken_by
    from pipeline_operator.spec import parse_spec as parse
    from ppl_factories import S3_SPEC, raw

    mine = parse(raw(S3_SPEC, persistence__s3__prefix="team/shared"), namespace="b", name="second")
    older_same = _resource("a", "first", "2026-01-01T00:00:00Z", raw(S3_SPEC, persistence__s3__prefix="team/shared"))
    assert root_taken_by(mine, "2026-02-01T00:00:00Z", [older_same]) == "a/first"
    # The older one keeps it: for it, the newer one is no conflict.
    older = parse(raw(S3_SPEC, persistence__s3__prefix="team/shared"), namespace="a", name="first")
    newer = _resource("b", "second", "2026-02-01T00:00:00Z", raw(S3_SPEC, persistence__s3__prefix="team/shared"))
    assert root_taken_by(older, "2026-01-01T00:00:00Z", [newer]) == ""
    # One inside the other overlaps (a reset of the outer one would delete the inner one);
    # a sibling prefix, another bucket or another endpoint does not.
    inner = _resource("a", "outer", "2026-01-01T00:00:00Z", raw(S3_SPEC, persistence__s3__prefix="team"))
    assert root_taken_by(mine, "2026-02-01T00:00:00Z", [inner]) == "a/outer"
    for change in ({"persistence__s3__prefix": "team/shared-2"}, {"persistence__s3__bucket": "other"},
                   {"persistence__s3__endpoint": "http://127.0.0.1:9999", "persistence__s3__prefix": "team/shared"}):
        other = _resource("a", "first", "2026-01-01T00:00:00Z", raw(S3_SPEC, **change))
        assert root_taken_by(mine, "2026-02-01T00:00:00Z", [other]) == ""


def test_claims_are_per_namespace() -> None:
    from pipeline_operator.policy import root_taken_by
    from pipeline_operator.spec import parse_spec as parse
    from ppl_factories import raw

    mine = parse(raw(persistence__filesystem__path="shared"), namespace="b", name="second")
    same_ns = _resource("b", "first", "2026-01-01T00:00:00Z", raw(persistence__filesystem__path="shared"))
    other_ns = _resource("a", "first", "2026-01-01T00:00:00Z", raw(persistence__filesystem__path="shared"))
    assert root_taken_by(mine, "2026-02-01T00:00:00Z", [same_ns]) == "b/first"
    assert root_taken_by(mine, "2026-02-01T00:00:00Z", [other_ns]) == ""
