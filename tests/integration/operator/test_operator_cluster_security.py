"""Least privilege on the local control plane's real API server: the chart's admission
policy refuses what a pipeline may not ask for (the same table of cases as the operator's
own check, tests/support/escalations.py), Pod Security "restricted" refuses what the
policy does not cover and the operator says so, and a dying driver's credentials never
reach the status or the Events."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from ppl_cluster import GROUP, PLURAL, ROOT, VERSION, Namespace, Operator, eventually, wordcount

from tests.support.escalations import ESCALATIONS, PLAIN

pytestmark = [pytest.mark.cluster]

CHART = ROOT / "charts" / "persistent-pipelines"
Policies = Callable[..., None]


@pytest.fixture
def policies(ns: Namespace) -> Iterator[Policies]:
    """Installs the chart's admission policies (as `helm install` renders them) for this
    test's namespace only; call it again with other values to replace them."""
    release = f"adm-{uuid.uuid4().hex[:6]}"

    def install(*values: str) -> None:
        rendered = ns.commands.helm(
            "template", release, str(CHART), "--namespace", "pp-system",
            "--show-only", "templates/admission/pipelines.yaml", "--show-only", "templates/admission/driver-pods.yaml",
            "--set", f"operator.watchNamespaces={{{ns.name}}}", "--set", f"driver.jobNamespaces={{{ns.name}}}", *values)
        ns.kubectl("apply", "-f", "-", stdin=rendered)
        # A new policy takes effect once the API server has loaded it, within a second or so.
        relaxed = "admission.allowPrivilegedPodTemplates=true" in values
        eventually("the policy in effect", lambda: bool(refusal(ns, {"driver": {"podTemplate": {"spec": {
            "serviceAccountName": "admin"}}}})) and relaxed != bool(refusal(ns, ESCALATIONS[1].spec)), timeout=30)

    yield install
    ns.kubectl("delete", "validatingadmissionpolicy,validatingadmissionpolicybinding", "-l",
               f"app.kubernetes.io/instance={release}", check=False)


def refusal(ns: Namespace, sections: dict[str, Any]) -> str:
    """What the API server answers to creating a pipeline with these spec sections (a dry
    run: every admission check runs, nothing is stored); "" when it would accept it."""
    manifest = wordcount("probe")
    manifest["spec"].update(sections)
    try:
        ns.custom.create_namespaced_custom_object(GROUP, VERSION, ns.name, PLURAL, manifest, dry_run="All")
    except client.ApiException as error:
        assert error.status in (403, 422), error.body
        return str(json.loads(error.body)["message"])
    return ""


def test_the_api_server_refuses_each_escalation_with_its_field_and_accepts_a_plain_template(
        ns: Namespace, policies: Policies) -> None:
    policies()
    wrong = {case.name: found for case in ESCALATIONS
             if f"{case.field}: " not in (found := refusal(ns, case.spec) or "accepted")}
    assert not wrong, json.dumps(wrong, indent=1)
    assert refusal(ns, PLAIN) == ""
    assert "spec.driver.serviceAccountName: must be one of [spark-app-driver]" in refusal(
        ns, {"driver": {"serviceAccountName": "admin"}})


def test_a_relaxed_policy_allows_privileges_but_never_another_account_or_plain_keys(
        ns: Namespace, policies: Policies) -> None:
    policies("--set", "admission.allowPrivilegedPodTemplates=true")
    wrong = {case.name: found for case in ESCALATIONS if bool(found := refusal(ns, case.spec)) == case.relaxable}
    assert not wrong, json.dumps(wrong, indent=1)


def test_a_pipeline_of_before_the_policy_can_still_be_deleted(ns: Namespace, policies: Policies) -> None:
    """The policy judges spec changes only: removing a finalizer from a pipeline it would
    refuse today must go through, or the pipeline could never be deleted."""
    old = wordcount("old", state="suspended")
    old["spec"]["driver"]["podTemplate"]["spec"]["hostNetwork"] = True
    old["metadata"]["finalizers"] = ["sparkapp.dev/finalizer"]
    ns.apply(old)
    policies()
    ns.delete("old")
    ns.custom.patch_namespaced_custom_object(GROUP, VERSION, ns.name, PLURAL, "old", {"metadata": {"finalizers": None}})
    eventually("the old pipeline gone", lambda: ns.pipeline("old") is None, timeout=30)


def test_a_driver_pod_that_pod_security_refuses_is_reported_on_the_pipeline(ns: Namespace, operator: Operator) -> None:
    """The namespace enforces "restricted", which refuses volume types the admission
    policy lets through: the operator asks the API server before it launches."""
    manifest = wordcount()
    manifest["spec"]["driver"]["podTemplate"]["spec"]["volumes"].append(
        {"name": "shared", "nfs": {"server": "nfs.example", "path": "/exports"}})
    ns.apply(manifest)
    message = eventually("the refusal in status", lambda: "PodSecurity" in ns.status("wordcount").get("message", "")
                         and ns.status("wordcount")["message"], timeout=30)
    assert ns.status("wordcount")["phase"] == "Invalid" and 'restricted volume types' in message, message
    assert ns.pod("wordcount-driver") is None and ns.announced("wordcount", "InvalidSpec") == ["InvalidSpec"]
    assert ns.status("wordcount")["driver"]["epoch"] == 0, "no epoch was spent on a pod that could not be created"


LEAKY = '''
import sys
print("connecting with AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", flush=True)
print("GET /api with Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl", file=sys.stderr)
raise RuntimeError("cannot reach postgres://app:hunter2@db:5432/orders with key AKIAIOSFODNN7EXAMPLE")
'''
SECRETS = ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "eyJzdWIiOiJzeXN0ZW0ifQ", "hunter2", "AKIAIOSFODNN7EXAMPLE")


def test_a_driver_that_prints_credentials_and_dies_leaks_none_into_status_or_events(
        ns: Namespace, operator: Operator) -> None:
    (ns.folder("data") / "leaky.py").write_text(LEAKY)
    manifest = wordcount(restartPolicy={"type": "Never"})
    manifest["spec"]["application"] = {"file": "/data/leaky.py"}
    ns.apply(manifest)
    eventually("the pipeline failed", lambda: ns.status("wordcount").get("phase") == "Failed", timeout=120)
    status = ns.status("wordcount")
    message = status["lastFailure"]["message"]
    assert "RuntimeError: cannot reach postgres://app:[redacted]@db:5432/orders" in message, message
    ns.announced("wordcount", "DriverLost")
    events = ns.events("wordcount")
    written = json.dumps(status) + json.dumps(events)
    assert not [secret for secret in SECRETS if secret in written], written
