"""The Reconciler against an in-memory API server: it records before it acts, acts only
on a current view, and reads what the decision needs (a stale epoch from the log tail)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from functools import cached_property
from typing import Any

import pytest
from pipeline_operator import names
from pipeline_operator.errors import Conflict
from pipeline_operator.metrics import Metrics
from pipeline_operator.reconcile import Reconciler
from pipeline_operator.settings import Settings
from pipeline_operator.spec import PipelineSpec, Prerequisite
from ppl_factories import NAME, NAMESPACE, NOW, S3_SPEC, UID, raw

from spark_app import contract


class FakeKube:
    """Just enough of pipeline_operator.kube.Kube, with a call log."""

    def __init__(self, spec: dict[str, Any], existing: Iterable[str] = ("state",)) -> None:
        self.resource: dict[str, Any] | None = {
            "apiVersion": names.API_VERSION, "kind": names.KIND, "spec": spec, "status": {},
            "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": UID, "generation": 1, "resourceVersion": "1"}}
        self.pods: dict[str, dict[str, Any]] = {}
        self.existing = set(existing)
        self.calls: list[str] = []
        self.logs = ""
        self.conflict_next_write = False
        self.others: list[dict[str, Any]] = []
        self.refuse = ""
        self.dry_runs: list[dict[str, Any]] = []

    def get_pipeline(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append("get_pipeline")
        return copy.deepcopy(self.resource)

    def replace_status(self, resource: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        assert self.resource is not None
        if self.conflict_next_write or resource["metadata"]["resourceVersion"] != self.resource["metadata"]["resourceVersion"]:
            self.conflict_next_write = False
            raise Conflict("the object has been modified")
        self.calls.append("replace_status")
        self.resource["status"] = copy.deepcopy(status)
        self.resource["metadata"]["resourceVersion"] = str(int(self.resource["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.resource)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get_pod {name}")
        return copy.deepcopy(self.pods.get(name))

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        name = pod["metadata"]["name"]
        if name in self.pods:
            raise Conflict("already exists")
        self.calls.append(f"create_pod {name}")
        self.pods[name] = {**copy.deepcopy(pod), "status": {"phase": "Pending"}}
        self.pods[name]["metadata"].update(uid=f"uid-{name}-{len(self.calls)}", creationTimestamp="2027-01-15T08:00:00Z")
        return self.pods[name]

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int | None = None) -> None:
        self.calls.append(f"delete_pod {name} grace={grace_seconds}")
        if grace_seconds == 0:
            self.pods.pop(name, None)
        elif name in self.pods:
            self.pods[name]["metadata"]["deletionTimestamp"] = "2027-01-15T08:05:00Z"

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: dict[str, str]) -> bool:
        pod = self.pods.get(name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return False
        self.calls.append(f"annotate_pod {name} {sorted(annotations)}")
        pod["metadata"]["annotations"].update(annotations)
        return True

    def ensure_service(self, service: dict[str, Any]) -> None:
        self.calls.append(f"ensure_service {service['metadata']['name']}")

    def log_tail(self, namespace: str, pod: str, container: str, limit_bytes: int = 4096) -> str:
        self.calls.append(f"log_tail {pod}")
        return self.logs

    def list_pipelines(self, namespace: str) -> list[dict[str, Any]]:
        self.calls.append("list_pipelines")
        return [copy.deepcopy(self.resource), *copy.deepcopy(self.others)]

    def missing(self, namespace: str, needed: Iterable[Prerequisite]) -> tuple[str, ...]:
        return tuple(f"{p.field}: {p.kind} {namespace}/{p.name} does not exist"
                     for p in needed if p.name not in self.existing)

    def refusal(self, pod: dict[str, Any]) -> str:
        self.dry_runs.append(copy.deepcopy(pod))
        return self.refuse

    def end_driver(self, exit_code: int, message: str = "") -> None:
        pod = self.pods[names.driver_pod_name(NAME)]
        pod["status"] = {"phase": "Failed" if exit_code else "Succeeded", "containerStatuses": [
            {"name": "driver", "state": {"terminated": {"exitCode": exit_code, "message": message}}}]}


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def reconciler(kube: FakeKube, metrics: Metrics) -> Reconciler:
    return Reconciler(kube, Settings(), metrics, clock=lambda: NOW)  # type: ignore[arg-type]


def test_a_new_pipeline_records_its_epoch_before_creating_the_service_and_pod(metrics: Metrics) -> None:
    kube = FakeKube(raw())
    outcome = reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    assert kube.calls == ["get_pipeline", "get_pod wc-driver", "list_pipelines", "replace_status",
                          "ensure_service wc-driver", "create_pod wc-driver"]
    assert kube.resource is not None and kube.resource["status"]["driver"]["epoch"] == 1
    assert kube.resource["status"]["phase"] == "Starting"
    assert [e.reason for e in outcome.events] == ["Created"] and outcome.resource is not None
    pod = kube.pods["wc-driver"]
    assert pod["metadata"]["annotations"][names.ANNOTATION_EPOCH] == "1"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == UID


def test_a_launch_computes_the_pod_hash_once_for_the_decision_and_the_pod(
        metrics: Metrics, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stateless, a launch reads the hash three times: the new generation, the hash it
    records, the pod's annotation. One pass parses the spec once and digests it once."""
    digests: list[str] = []
    digest = PipelineSpec.pod_hash.func

    def counted(spec: PipelineSpec) -> str:
        digests.append(spec.name)
        return digest(spec)

    counting = cached_property(counted)
    counting.__set_name__(PipelineSpec, "pod_hash")
    monkeypatch.setattr(PipelineSpec, "pod_hash", counting)
    kube = FakeKube(raw(upgradeMode="stateless"))
    reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    assert kube.calls[-1] == "create_pod wc-driver" and digests == [NAME]
    assert kube.resource is not None and kube.resource["status"]["persistence"]["root"].endswith("/generations/1")
    recorded = kube.resource["status"]["persistence"]["appliedHash"]
    assert kube.pods["wc-driver"]["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH] == recorded


def test_a_conflicting_status_write_acts_on_nothing(metrics: Metrics) -> None:
    kube = FakeKube(raw())
    kube.conflict_next_write = True
    with pytest.raises(Conflict):
        reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    assert kube.pods == {} and not any(c.startswith(("create", "ensure")) for c in kube.calls)


def test_nothing_is_written_when_nothing_changed(metrics: Metrics) -> None:
    kube = FakeKube(raw(state="suspended"))
    reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    kube.calls.clear()
    reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    assert "replace_status" not in kube.calls


def test_a_second_pipeline_on_the_same_state_creates_no_pod(metrics: Metrics) -> None:
    kube = FakeKube(raw())
    kube.resource["metadata"]["creationTimestamp"] = "2027-01-15T09:00:00Z"  # type: ignore[index]
    kube.others = [{"metadata": {"namespace": NAMESPACE, "name": "first", "uid": "uid-first",
                                 "creationTimestamp": "2027-01-15T08:00:00Z"},
                   "spec": raw(persistence__filesystem__path=f"{NAMESPACE}/{NAME}")}]
    outcome = reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    assert kube.pods == {} and [e.reason for e in outcome.events] == ["StateRootConflict"]
    assert kube.resource is not None and kube.resource["status"]["phase"] == "Invalid"


def test_a_missing_claim_creates_no_pod(metrics: Metrics) -> None:
    kube = FakeKube(raw(), existing=())
    outcome = reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    assert kube.pods == {} and [e.reason for e in outcome.events] == ["InvalidSpec"]
    assert kube.resource is not None and kube.resource["status"]["phase"] == "Invalid"


def test_a_stale_epoch_without_a_termination_message_is_read_from_the_log(metrics: Metrics) -> None:
    kube = FakeKube(raw())
    run = reconciler(kube, metrics)
    run.reconcile(NAMESPACE, NAME)
    kube.end_driver(contract.EXIT_FENCED)
    kube.logs = f"ERROR spark_app: {contract.STALE_EPOCH_PREFIX}6: epoch 1 is not above it\n"
    outcome = run.reconcile(NAMESPACE, NAME)
    assert "log_tail wc-driver" in kube.calls and [e.reason for e in outcome.events] == ["StaleEpoch"]
    assert kube.calls[-1] == "delete_pod wc-driver grace=0"
    run.reconcile(NAMESPACE, NAME)
    assert kube.pods["wc-driver"]["metadata"]["annotations"][names.ANNOTATION_EPOCH] == "7"


def test_a_failed_driver_counts_a_restart_by_reason_when_relaunched(metrics: Metrics) -> None:
    kube = FakeKube(raw(restartPolicy={"backoff": {"initialSeconds": 0, "maxSeconds": 0}}))
    run = reconciler(kube, metrics)
    run.reconcile(NAMESPACE, NAME)
    kube.end_driver(1, "boom")
    run.reconcile(NAMESPACE, NAME)
    assert "wc-driver" not in kube.pods
    run.reconcile(NAMESPACE, NAME)
    assert kube.pods["wc-driver"]["metadata"]["annotations"][names.ANNOTATION_EPOCH] == "2"
    assert metrics.restarts.labels(NAMESPACE, NAME, "Error")._value.get() == 1
    assert kube.resource is not None and kube.resource["status"]["lastFailure"]["message"] == "boom"


def test_deleting_with_ondelete_delete_creates_the_cleanup_pod_then_releases(metrics: Metrics) -> None:
    kube = FakeKube(raw(S3_SPEC, persistence__onDelete="Delete"), existing=("s3-creds",))
    assert kube.resource is not None
    kube.resource["metadata"]["deletionTimestamp"] = "2027-01-15T08:10:00Z"
    run = reconciler(kube, metrics)
    first = run.reconcile(NAMESPACE, NAME)
    assert not first.released and "create_pod wc-cleanup" in kube.calls
    kube.pods["wc-cleanup"]["status"] = {"phase": "Succeeded"}
    assert run.reconcile(NAMESPACE, NAME).released


def test_a_gone_pipeline_is_forgotten(metrics: Metrics) -> None:
    kube = FakeKube(raw())
    kube.resource = None
    assert reconciler(kube, metrics).reconcile(NAMESPACE, NAME).resource is None


def test_a_failure_without_a_termination_message_is_explained_by_the_log_tail(metrics: Metrics) -> None:
    kube = FakeKube(raw())
    run = reconciler(kube, metrics)
    run.reconcile(NAMESPACE, NAME)
    kube.end_driver(contract.EXIT_MISCONFIGURED)
    kube.logs = "pipeline file examples/nope.py does not exist\n"
    outcome = run.reconcile(NAMESPACE, NAME)
    assert kube.resource is not None
    assert kube.resource["status"]["lastFailure"]["message"] == "pipeline file examples/nope.py does not exist"
    assert "does not exist" in outcome.events[0].message


def test_a_clean_exit_reads_no_log(metrics: Metrics) -> None:
    kube = FakeKube(raw())
    run = reconciler(kube, metrics)
    run.reconcile(NAMESPACE, NAME)
    kube.end_driver(0)
    run.reconcile(NAMESPACE, NAME)
    assert not any(c.startswith("log_tail") for c in kube.calls)


def test_credentials_in_the_log_tail_never_reach_the_status_or_events(metrics: Metrics) -> None:
    kube = FakeKube(raw())
    run = reconciler(kube, metrics)
    run.reconcile(NAMESPACE, NAME)
    kube.end_driver(1)
    kube.logs = ("Traceback (most recent call last):\n"
                 "RuntimeError: login as admin password=hunter2 with AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG\n")
    outcome = run.reconcile(NAMESPACE, NAME)
    assert kube.resource is not None
    written = str(kube.resource["status"]) + str([e.message for e in outcome.events])
    assert "hunter2" not in written and "wJalrXUtnFEMI" not in written
    assert "RuntimeError: login as admin password=[redacted]" in kube.resource["status"]["lastFailure"]["message"]


def test_a_driver_pod_the_api_server_would_refuse_is_reported_and_not_launched(metrics: Metrics) -> None:
    kube = FakeKube(raw())
    kube.refuse = ('the API server refuses its pod (403): pods "wc-driver" is forbidden: violates PodSecurity '
                   '"restricted:latest": restricted volume types (volume "nfs" uses restricted volume type "nfs")')
    run = reconciler(kube, metrics)
    outcome = run.reconcile(NAMESPACE, NAME)
    assert kube.pods == {} and [e.reason for e in outcome.events] == ["InvalidSpec"]
    assert kube.resource is not None and kube.resource["status"]["phase"] == "Invalid"
    assert 'violates PodSecurity "restricted:latest"' in kube.resource["status"]["message"]
    assert kube.dry_runs[0]["metadata"]["annotations"][names.ANNOTATION_EPOCH] == "1"
    assert [e.reason for e in run.reconcile(NAMESPACE, NAME).events] == [], "announced once"
    kube.refuse = ""
    run.reconcile(NAMESPACE, NAME)
    assert "wc-driver" in kube.pods and kube.resource["status"]["driver"]["epoch"] == 1


def test_a_privileged_template_is_refused_unless_the_operator_allows_it(metrics: Metrics) -> None:
    privileged = raw(driver={"podTemplate": {"spec": {"hostNetwork": True}}})
    kube = FakeKube(privileged)
    reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    assert kube.pods == {} and kube.resource is not None
    assert "spec.driver.podTemplate.spec.hostNetwork: host namespaces are not allowed" in \
        kube.resource["status"]["message"]
    allowed = FakeKube(privileged)
    Reconciler(allowed, Settings(allow_privileged_pod_templates=True), metrics,  # type: ignore[arg-type]
               clock=lambda: NOW).reconcile(NAMESPACE, NAME)
    assert allowed.pods["wc-driver"]["spec"]["hostNetwork"] is True


def test_a_backfill_rate_changed_in_the_spec_reaches_the_running_driver_without_a_restart(metrics: Metrics) -> None:
    kube = FakeKube(raw(inputs=[{"persistentId": "accounts", "backfill": {"rowsPerSecond": 1000}}]))
    reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    pod = kube.pods["wc-driver"]
    pod["status"] = {"phase": "Running"}
    kube.calls.clear()
    reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    assert not any(c.startswith("annotate_pod") for c in kube.calls)

    assert kube.resource is not None
    kube.resource["spec"]["inputs"][0]["backfill"]["rowsPerSecond"] = 0
    kube.resource["metadata"]["generation"] = 2
    outcome = reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    settings = pod["metadata"]["annotations"][contract.LIVE_SETTINGS_ANNOTATION]
    assert contract.LiveSettings.from_json(settings).backfill_rates == {"accounts": 0}
    assert not any(c.startswith(("delete_pod", "create_pod")) for c in kube.calls)
    [event] = [e for e in outcome.events if e.reason == "LiveSettingsChanged"]
    assert "accounts paused" in event.message
    kube.calls.clear()
    reconciler(kube, metrics).reconcile(NAMESPACE, NAME)
    assert not any(c.startswith("annotate_pod") for c in kube.calls)
