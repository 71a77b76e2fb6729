"""Least privilege, without a cluster: what a pipeline may not ask for (each case of the
table the admission policy is tested with too), and that every pod the operator builds
meets Pod Security "restricted" (the cluster tests have the API server check it for real)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pipeline_operator import builders, podsecurity
from pipeline_operator.errors import InvalidSpec
from pipeline_operator.spec import PipelineSpec, parse_spec
from ppl_factories import FILESYSTEM_SPEC, NAME, NAMESPACE, S3_SPEC, spec

from spark_app import contract
from tests.support.escalations import ESCALATIONS, PLAIN, Escalation

OWNER = builders.owner_reference({"metadata": {"name": NAME, "uid": "uid-ppl"}})
# Pod Security "restricted" (https://kubernetes.io/docs/concepts/security/pod-security-standards/).
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def restricted_violations(pod_spec: dict[str, Any]) -> list[str]:
    """What of a pod spec Pod Security "restricted" refuses, as its admission checks it."""
    found = [key for key in ("hostNetwork", "hostPID", "hostIPC") if pod_spec.get(key)]
    found += [f"volume {v['name']}" for v in pod_spec.get("volumes") or [] if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    pod = pod_spec.get("securityContext") or {}
    for c in (pod_spec.get("initContainers") or []) + pod_spec["containers"]:
        own = c.get("securityContext") or {}
        capabilities = own.get("capabilities") or {}
        checks = {
            "privileged": own.get("privileged") is True,
            "allowPrivilegeEscalation": own.get("allowPrivilegeEscalation") is not False,
            "runAsNonRoot": own.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True,
            "runAsUser": own.get("runAsUser", pod.get("runAsUser")) == 0,
            "seccompProfile": (own.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
            not in ("RuntimeDefault", "Localhost"),
            "capabilities.drop": "ALL" not in capabilities.get("drop", []),
            "capabilities.add": bool(set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}),
            "hostPort": any(p.get("hostPort") for p in c.get("ports") or []),
        }
        found += [f"{c['name']}: {check}" for check, failed in checks.items() if failed]
    return found


def with_sections(sections: dict[str, Any]) -> dict[str, Any]:
    return {**FILESYSTEM_SPEC, **sections}


def refusals(sections: dict[str, Any], *, allow_privileged: bool = False) -> list[str]:
    try:
        parse_spec(with_sections(sections), namespace=NAMESPACE, name=NAME, allow_privileged=allow_privileged)
    except InvalidSpec as invalid:
        return [str(p) for p in invalid.problems]
    return []


# ---- what a pipeline may not ask for -------------------------------------------------------------


@pytest.mark.parametrize("case", ESCALATIONS, ids=lambda c: c.name)
def test_each_escalation_is_refused_with_its_field_and_why(case: Escalation) -> None:
    found = refusals(case.spec)
    assert [p for p in found if p.startswith(f"{case.field}: ")], found
    assert all(": " in p and len(p.split(": ", 1)[1]) > 20 for p in found), "each problem says why"


@pytest.mark.parametrize("case", ESCALATIONS, ids=lambda c: c.name)
def test_the_relaxed_mode_allows_host_access_and_privileges_but_never_another_account_or_plain_keys(
        case: Escalation) -> None:
    found = refusals(case.spec, allow_privileged=True)
    assert bool(found) == (not case.relaxable), found


@pytest.mark.parametrize("allow_privileged", [False, True])
def test_a_plain_spec_asks_for_nothing_refused(allow_privileged: bool) -> None:
    assert refusals(PLAIN, allow_privileged=allow_privileged) == []


def test_a_privilege_refusal_says_how_an_administrator_may_allow_it() -> None:
    assert all(podsecurity.RELAX_HINT in p for case in ESCALATIONS if case.relaxable for p in refusals(case.spec))


# ---- what every pod starts from ------------------------------------------------------------------


def pods_of(s: PipelineSpec) -> dict[str, dict[str, Any]]:
    """Every pod spec the operator builds for ``s``: the driver's, the cleanup pod's, and in
    Kubernetes execution the executors' template."""
    pods = {"driver": builders.driver_pod(s, epoch=1, state_root=s.persistence.base_uri, owner=OWNER)["spec"],
            "cleanup": builders.cleanup_pod(s, owner=OWNER)["spec"]}
    if s.execution.mode == "Kubernetes":
        pods["executor"] = builders.executor_pod_template(s)["spec"]
    return pods


@pytest.mark.parametrize("s", [spec(), spec(S3_SPEC), spec(execution={"mode": "Kubernetes"}),
                               spec(S3_SPEC, execution={"mode": "Kubernetes"}), spec(with_sections(PLAIN))],
                         ids=["local", "s3", "kubernetes", "kubernetes-s3", "plain-template"])
def test_every_pod_the_operator_builds_meets_pod_security_restricted(s: PipelineSpec) -> None:
    for kind, pod_spec in pods_of(s).items():
        assert restricted_violations(pod_spec) == [], kind
        main = pod_spec["containers"][0] if kind != "driver" else next(
            c for c in pod_spec["containers"] if c["name"] == "driver")
        assert main["securityContext"]["readOnlyRootFilesystem"] is True, kind
        assert "/tmp" in [m["mountPath"] for m in main["volumeMounts"]], kind


def test_the_driver_writes_only_to_its_scratch_volumes_and_claims() -> None:
    pod = builders.driver_pod(spec(), epoch=1, state_root="pvc://state/team/wc", owner=OWNER)["spec"]
    driver = pod["containers"][0]
    assert {m["mountPath"] for m in driver["volumeMounts"] if not m.get("readOnly")} == {
        "/tmp", podsecurity.LOCAL_DIR, podsecurity.CACHE_DIR, "/var/lib/spark-app/state"}
    assert {v["name"]: v for v in pod["volumes"]}["tmp"] == {"name": "tmp", "emptyDir": {}}
    conf = json.loads({e["name"]: e for e in driver["env"]}[contract.SPARK_CONF]["value"])
    assert conf["spark.local.dir"] == podsecurity.LOCAL_DIR
    assert conf["spark.sql.warehouse.dir"].startswith("/tmp/"), "not the working directory, which is read-only"
    assert conf["spark.jars.ivy"].startswith(podsecurity.CACHE_DIR)
    assert pod["securityContext"]["runAsUser"] == podsecurity.SPARK_APP_UID


def test_a_template_may_choose_another_non_root_uid_a_bigger_scratch_volume_and_spark_settings() -> None:
    s = spec(with_sections(PLAIN), application={"file": "p.py", "sparkConf": {"spark.local.dir": "/data/scratch"}})
    pod = builders.driver_pod(s, epoch=1, state_root=s.persistence.base_uri, owner=OWNER)["spec"]
    assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["runAsNonRoot"] is True
    assert {v["name"]: v for v in pod["volumes"]}["spark-local"] == {"name": "spark-local",
                                                                    "emptyDir": {"sizeLimit": "20Gi"}}
    sidecar = next(c for c in pod["containers"] if c["name"] == "sidecar")
    assert sidecar["securityContext"] == podsecurity.container_security_context(), "a sidecar is restricted too"
    assert "volumeMounts" not in sidecar
    conf = json.loads({e["name"]: e for e in pod["containers"][0]["env"]}[contract.SPARK_CONF]["value"])
    assert conf["spark.local.dir"] == "/data/scratch"


# ---- the executors' pod template ----------------------------------------------------------------


def test_executors_get_s3_credentials_as_the_same_secret_references_and_no_api_token() -> None:
    template = builders.executor_pod_template(spec(S3_SPEC, execution={"mode": "Kubernetes"}))
    assert template["spec"]["automountServiceAccountToken"] is False
    executor = template["spec"]["containers"][0]
    assert executor["name"] == contract.EXECUTOR_CONTAINER
    env = {e["name"]: e for e in executor["env"]}
    assert env[contract.AWS_SECRET_ACCESS_KEY] == {"name": contract.AWS_SECRET_ACCESS_KEY, "valueFrom": {
        "secretKeyRef": {"name": "s3-creds", "key": "AWS_SECRET_ACCESS_KEY"}}}
    assert env[contract.AWS_ACCESS_KEY_ID]["valueFrom"]["secretKeyRef"]["name"] == "s3-creds"
    assert env[contract.S3_ENDPOINT]["value"] == "http://127.0.0.1:9000"
    assert not [e for e in env.values() if e["name"].startswith("AWS_") and "value" in e]
    # Spark mounts its own emptyDir at spark.local.dir; a second mount there would clash.
    assert podsecurity.LOCAL_DIR not in [m["mountPath"] for m in executor["volumeMounts"]]


def test_the_driver_writes_the_executor_template_the_operator_built(tmp_path: Path) -> None:
    """Both sides of the contract: the env of a Kubernetes-mode driver pod, read by the
    driver's spark_app.contract.executor_pod_template_conf."""
    s = spec(S3_SPEC, execution={"mode": "Kubernetes"})
    pod = builders.driver_pod(s, epoch=1, state_root=s.persistence.base_uri, owner=OWNER)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
    conf = contract.executor_pod_template_conf(env, str(tmp_path))
    assert json.loads(Path(conf["spark.kubernetes.executor.podTemplateFile"]).read_text()) == \
        builders.executor_pod_template(s)
    local = builders.driver_pod(spec(), epoch=1, state_root="pvc://state/team/wc", owner=OWNER)
    assert contract.EXECUTOR_POD_TEMPLATE not in [e["name"] for e in local["spec"]["containers"][0]["env"]]
