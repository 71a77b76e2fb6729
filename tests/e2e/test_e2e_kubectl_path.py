"""The kubectl path: `kubectl apply -f crds/` and `kubectl apply -f deploy/persistent-pipelines.yaml`
install a working operator without Helm (cluster-wide, drivers in `default`), with the
least privilege of a cluster-wide install (`kubectl auth can-i`).

It runs before the story (tests/e2e/test_e2e_story.py) and removes everything it applied:
this operator serves all namespaces, so it must be gone before another one serves any."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from e2e_release import KUBECTL_PATH_MANIFEST as MANIFEST
from e2e_release import ROOT

from demo.story import Namespace, wait_for
from demo.targets import Target

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

# A stand-in driver (a shell, not Spark): this is about the install, not the runtime.
STAND_IN = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
PIPELINE = {
    "apiVersion": "sparkapp.dev/v1alpha1", "kind": "PersistentPipeline", "metadata": {"name": "e2e-kubectl-path"},
    "spec": {"application": {"file": "examples/wordcount.py"},
             "driver": {"serviceAccountName": "spark-app-driver", "terminationGracePeriodSeconds": 5,
                        "podTemplate": {"spec": {"containers": [{"name": "driver", "command": STAND_IN}]}}},
             "persistence": {"filesystem": {"claimName": "e2e-kubectl-path"}}},
}
RBAC_DENIAL = 'forbidden: User "system:serviceaccount:persistent-pipelines:'
CLAIM = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "e2e-kubectl-path"},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}


def can_i(target: Target, account: str, verb: str, resource: str, namespace: str) -> bool:
    answer = target.kubectl("auth", "can-i", verb, resource, "-n", namespace, f"--as={account}", check=False)
    return answer.strip() == "yes"


@pytest.fixture
def applied(target: Target) -> Iterator[Target]:
    target.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    target.kubectl("apply", "-f", str(MANIFEST))
    yield target
    name = PIPELINE["metadata"]["name"]
    target.kubectl("delete", "ppl", name, "-n", "default", "--ignore-not-found", "--timeout=60s", check=False)
    target.kubectl("patch", "ppl", name, "-n", "default", "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                   check=False)  # only if the operator could not release it
    target.kubectl("delete", "-f", str(MANIFEST), "--ignore-not-found", "--wait=true", "--timeout=120s")
    target.kubectl("delete", "pvc", CLAIM["metadata"]["name"], "-n", "default", "--ignore-not-found")


def test_the_rendered_manifest_installs_an_operator_that_serves_pipelines(applied: Target) -> None:
    applied.kubectl("rollout", "status", "statefulset/persistent-pipelines-operator", "-n", "persistent-pipelines",
                    "--timeout=180s")
    default = Namespace(applied, "default")
    applied.kubectl("apply", "-n", "default", "-f", "-", stdin=json.dumps(CLAIM))
    applied.kubectl("apply", "-n", "default", "-f", "-", stdin=json.dumps(PIPELINE))
    operator, driver_account = ("system:serviceaccount:persistent-pipelines:persistent-pipelines-operator",
                                "system:serviceaccount:default:spark-app-driver")
    # Cluster-wide: the operator serves every namespace, but reads Secrets only in the job namespace.
    assert can_i(applied, operator, "create", "pods", "kube-system")
    assert can_i(applied, operator, "get", "secrets", "default")
    assert not can_i(applied, operator, "get", "secrets", "kube-system")
    assert not can_i(applied, operator, "list", "secrets", "default")
    assert can_i(applied, driver_account, "patch", "pods", "default")
    assert not can_i(applied, driver_account, "create", "pods", "default"), "Local execution by default"
    assert not can_i(applied, driver_account, "get", "secrets", "default")
    assert not can_i(applied, driver_account, "get", "pods", "kube-system")
    driver = wait_for("a driver pod created by the operator", lambda: default.driver("e2e-kubectl-path"), 120)
    assert driver["spec"]["serviceAccountName"] == "spark-app-driver"
    assert driver["metadata"]["annotations"]["sparkapp.dev/epoch"] == "1"
    wait_for("phase Running", lambda: default.status("e2e-kubectl-path").get("phase") == "Running", 60)
    log = applied.kubectl("logs", "-n", "persistent-pipelines", "persistent-pipelines-operator-0")
    # RBAC denials name the operator's account; a namespace being deleted (by an earlier test) also
    # answers 403, but says NamespaceTerminating and is not about the manifest's roles.
    denied = [line for line in log.splitlines() if RBAC_DENIAL in line]
    assert not denied, "\n".join(denied[:5])

    # A pipeline in a namespace that is no job namespace: the operator may not read its Secret,
    # and says which chart value fixes it.
    elsewhere = Namespace(applied, f"e2e-elsewhere-{uuid.uuid4().hex[:5]}")
    applied.create_namespace(elsewhere.name)
    try:
        applied.kubectl("create", "secret", "generic", "s3-creds", "-n", elsewhere.name,
                        "--from-literal=AWS_ACCESS_KEY_ID=x", "--from-literal=AWS_SECRET_ACCESS_KEY=y")
        s3 = json.loads(json.dumps(PIPELINE))
        s3["spec"]["persistence"] = {"s3": {"bucket": "pipelines", "credentialsSecret": {"name": "s3-creds"}}}
        applied.kubectl("apply", "-n", elsewhere.name, "-f", "-", stdin=json.dumps(s3))
        message = wait_for("the refused read reported", lambda: "may not read Secret" in (
            found := elsewhere.status("e2e-kubectl-path").get("message", "")) and found, 60)
        assert "list this namespace in the chart's driver.jobNamespaces" in message, message
        assert elsewhere.status("e2e-kubectl-path")["phase"] == "Invalid" and not elsewhere.driver("e2e-kubectl-path")
    finally:
        applied.kubectl("delete", "ppl", "e2e-kubectl-path", "-n", elsewhere.name, "--ignore-not-found",
                        "--timeout=60s", check=False)
        applied.kubectl("delete", "namespace", elsewhere.name, "--wait=false", check=False)
