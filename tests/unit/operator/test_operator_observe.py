"""Reading pods and driver reports as the API server returns them."""

from __future__ import annotations

import json

from pipeline_operator.observe import (
    DriverReport,
    QueryReport,
    driver_pod,
    format_time,
    parse_report,
    parse_time,
    pod_phase,
    stale_epoch_in,
)
from ppl_factories import pod_json, spec

from spark_app import contract

S = spec()
REPORT = {"epoch": 2, "stored_epoch": 1, "state": "running", "reported_ms": 1_800_000_000_500,
          "queries": {"counts": {"batch": 4, "batch_time_ms": 1, "commit_time_ms": 1_800_000_000_000,
                                 "offsets": {"words": {"files": 3}}, "backlog": False, "active": True,
                                 "malformed": 1, "iterate": None, "input_rows_per_s": 2.0}}}


def test_a_running_driver_pod_with_its_report() -> None:
    status = {"phase": "Running", "containerStatuses": [
        {"name": "driver", "state": {"running": {"startedAt": "2027-01-15T08:00:10Z"}}}]}
    pod = driver_pod(pod_json(S, epoch=2, status=status, report_json=REPORT))
    assert (pod.name, pod.uid, pod.epoch, pod.phase) == ("wc-driver", "pod-1", 2, "Running")
    assert pod.spec_hash == S.pod_hash and pod.state_root == "pvc://state/team/wc" and not pod.terminating
    assert pod.started_at == 1_800_000_010.0 and pod.created_at == 1_800_000_000.0
    assert not pod.ended and pod.exit_code is None
    assert pod.report == DriverReport(epoch=2, stored_epoch=1, state="running", reported_at=1_800_000_000.5, queries={
        "counts": QueryReport(batch=4, batch_time_ms=1, commit_time_ms=1_800_000_000_000,
                              offsets={"words": {"files": 3}}, backlog=False, active=True, malformed=1,
                              input_rows_per_s=2.0)})
    assert pod.report.last_commit_ms == 1_800_000_000_000 and not pod.report.idle


def test_a_terminated_driver_with_its_message() -> None:
    message = f"{contract.STALE_EPOCH_PREFIX}7: epoch 2 is not above it"
    status = {"phase": "Failed", "containerStatuses": [{"name": "driver", "state": {"terminated": {
        "exitCode": 3, "reason": "Error", "message": message}}}]}
    pod = driver_pod(pod_json(S, status=status))
    assert pod.ended and (pod.exit_code, pod.reason, pod.message) == (3, "Error", message) and pod.stale_epoch == 7


def test_an_evicted_pod_and_a_waiting_one_and_a_deleting_one() -> None:
    evicted = driver_pod(pod_json(S, status={"phase": "Failed", "reason": "Evicted", "message": "low on memory"}))
    assert evicted.ended and evicted.reason == "Evicted" and evicted.message == "low on memory"
    waiting = driver_pod(pod_json(S, status={"phase": "Pending", "containerStatuses": [
        {"name": "driver", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}))
    assert waiting.waiting_reason == "ImagePullBackOff" and not waiting.ended
    assert driver_pod(pod_json(S, deleting=True)).terminating


def test_the_stale_epoch_is_read_only_from_exit_code_3_and_anywhere_in_the_message() -> None:
    assert stale_epoch_in(f"log line\n{contract.STALE_EPOCH_PREFIX}12: epoch 3") == 12
    assert stale_epoch_in("driver epoch 1 was superseded") is None and stale_epoch_in("") is None
    status = {"phase": "Failed", "containerStatuses": [{"name": "driver", "state": {"terminated": {
        "exitCode": 1, "message": f"{contract.STALE_EPOCH_PREFIX}12"}}}]}
    assert driver_pod(pod_json(S, status=status)).stale_epoch is None


def test_a_malformed_report_is_ignored() -> None:
    assert parse_report(None) is None and parse_report("not json") is None
    assert parse_report(json.dumps({"epoch": 1})) is None  # no reported_ms
    assert parse_report(json.dumps({"epoch": 1, "reported_ms": 5, "queries": {"q": {"batch": "x"}}})) is None
    idle = parse_report(json.dumps({"epoch": 1, "state": "running", "reported_ms": 5, "queries": {"q": {}}}))
    assert idle is not None and idle.idle and idle.last_commit_ms is None


def test_pod_phase() -> None:
    assert pod_phase(None) is None and pod_phase({"status": {}}) == "Pending"
    assert pod_phase({"status": {"phase": "Succeeded"}}) == "Succeeded"


def test_times_are_rfc3339_in_utc_with_milliseconds_or_whole_seconds() -> None:
    """One format for status, conditions and messages, as Kubernetes writes its own times."""
    assert format_time(1_800_000_000.125) == "2027-01-15T08:00:00.125Z"
    assert format_time(1_800_000_000.125, fraction=False) == "2027-01-15T08:00:00Z"
    assert parse_time("2027-01-15T08:00:00.125Z") == 1_800_000_000.125
    assert parse_time("2027-01-15T08:00:00Z") == parse_time("2027-01-15T08:00:00.000Z") == 1_800_000_000.0
    assert parse_time(format_time(1_800_000_000.5)) == 1_800_000_000.5
    assert parse_time(None) is None and parse_time("") is None
def test_credentials_in_a_termination_message_are_scrubbed_as_the_pod_is_read() -> None:
    message = ("RuntimeError: cannot reach postgres://app:hunter2@db/orders with key AKIAIOSFODNN7EXAMPLE\n"
               f"{contract.STALE_EPOCH_PREFIX}4")
    status = {"phase": "Failed", "containerStatuses": [{"name": "driver", "state": {"terminated": {
        "exitCode": 3, "reason": "Error", "message": message}}}]}
    pod = driver_pod(pod_json(S, status=status))
    assert "hunter2" not in pod.message and "AKIAIOSFODNN7EXAMPLE" not in pod.message
    assert pod.message.startswith("RuntimeError: cannot reach postgres://app:[redacted]@db/orders")
    assert pod.stale_epoch == 4
