"""The Helm chart (charts/persistent-pipelines), rendered with `helm template` and read like
a specification of what an install creates."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from chart_render import CHART, ROOT, Manifest, Rendered, helm, render, render_error

PIPELINES_ROLE = "persistent-pipelines-operator-pipelines"
CLUSTER_ROLE = "persistent-pipelines-operator"
DRIVER_ROLE = "persistent-pipelines-driver"
SECRETS_ROLE = "persistent-pipelines-operator-secrets"
PIPELINES_POLICY = "persistent-pipelines-pipelines"
DRIVER_PODS_POLICY = "persistent-pipelines-driver-pods"


def rules(role: Manifest) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs."""
    found: dict[tuple[str, str], set[str]] = {}
    for rule in role.get("rules") or []:
        for group in rule.get("apiGroups", [""]):
            for resource in rule.get("resources", []):
                found.setdefault((group, resource), set()).update(rule["verbs"])
    return found


def env(rendered: Rendered) -> dict[str, Any]:
    return {e["name"]: e for e in rendered.container.get("env") or []}


# ---- the chart as a whole -------------------------------------------------------------------


def test_helm_lint_passes_strictly() -> None:
    result = helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_charts_crds_are_the_source_crds_byte_for_byte() -> None:
    source = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    copies = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert source.keys() == copies.keys(), "the chart must ship every CRD of crds/, and only those"
    drifted = [name for name in source if source[name] != copies[name]]
    assert not drifted, f"{drifted} drifted from crds/: copy them again (cp crds/*.yaml {CHART / 'crds'}/)"


def test_every_resource_carries_the_charts_labels() -> None:
    for manifest in render({"operator": {"replicas": 2, "metrics": {"service": {"enabled": True}}}}):
        labels = manifest["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "persistent-pipelines", manifest["metadata"]["name"]
        assert labels["app.kubernetes.io/instance"] == "persistent-pipelines"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "persistent-pipelines-0.1.0"


def test_names_and_labels_are_spelt_only_in_the_helpers() -> None:
    for template in (CHART / "templates").rglob("*.yaml"):
        text = template.read_text()
        assert "app.kubernetes.io/" not in text, f"{template.name} spells a label; use _helpers.tpl"
        assert not re.search(r"\.Release\.Name\b", text), f"{template.name} builds a name; use _helpers.tpl"


# ---- the operator -------------------------------------------------------------------------


def test_the_operator_runs_its_image_with_the_charts_version_by_default() -> None:
    rendered = render()
    assert rendered.container["image"] == "ghcr.io/persistent-pipelines/operator:0.1.0"
    assert rendered.container["imagePullPolicy"] == "IfNotPresent"
    assert "command" not in rendered.container, "the image's entrypoint is python -m pipeline_operator"
    custom = render({"operator": {"image": {"registry": "", "repository": "op", "tag": "dev", "pullPolicy": "Never"}}})
    assert (custom.container["image"], custom.container["imagePullPolicy"]) == ("op:dev", "Never")


def test_one_replica_runs_standalone_without_peering() -> None:
    rendered = render()
    assert rendered.operator["spec"]["replicas"] == 1
    assert not [a for a in rendered.args if a.startswith("--peering")]
    assert "PIPELINE_OPERATOR_PRIORITY" not in env(rendered)
    assert not rendered.all("ClusterKopfPeering") and not rendered.all("KopfPeering")
    assert ("kopf.dev", "clusterkopfpeerings") not in rules(rendered.one("ClusterRole", CLUSTER_ROLE))


def test_several_replicas_peer_with_a_distinct_priority_each() -> None:
    rendered = render({"operator": {"replicas": 3, "peering": {"name": "team-pipelines"}}})
    assert rendered.operator["spec"]["replicas"] == 3
    assert "--peering=team-pipelines" in rendered.args
    # kopf freezes every replica when two share a priority: each takes its ordinal.
    priority = env(rendered)["PIPELINE_OPERATOR_PRIORITY"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert priority == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert rendered.one("ClusterKopfPeering", "team-pipelines")
    assert rules(rendered.one("ClusterRole", CLUSTER_ROLE))[("kopf.dev", "clusterkopfpeerings")] == {
        "get", "list", "watch", "patch"}


def test_replicas_serving_listed_namespaces_peer_in_each_of_them() -> None:
    rendered = render({"operator": {"replicas": 2, "watchNamespaces": ["a", "b"]},
                       "driver": {"jobNamespaces": ["a"]}})
    assert {m["metadata"]["namespace"] for m in rendered.all("KopfPeering")} == {"a", "b"}
    assert not rendered.all("ClusterKopfPeering")
    assert ("kopf.dev", "kopfpeerings") in rules(rendered.one("ClusterRole", PIPELINES_ROLE))


def test_an_upgrade_never_runs_two_operators_at_once() -> None:
    # A StatefulSet deletes a pod before it creates its replacement (a Deployment would overlap them).
    operator = render().operator
    assert operator["kind"] == "StatefulSet"
    assert operator["spec"]["updateStrategy"] == {"type": "RollingUpdate"}


def test_probes_and_ports_follow_the_values() -> None:
    rendered = render({"operator": {"livenessPort": 18080, "metrics": {"port": 19090}}})
    assert "--liveness-port=18080" in rendered.args and "--metrics-port=19090" in rendered.args
    ports = {p["name"]: p["containerPort"] for p in rendered.container["ports"]}
    assert ports == {"healthz": 18080, "metrics": 19090}
    for probe in ("livenessProbe", "readinessProbe"):
        assert rendered.container[probe]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert rendered.container["livenessProbe"]["periodSeconds"] == 10


def test_metrics_can_be_turned_off_and_get_a_service_only_when_asked() -> None:
    assert not render().all("Service")
    off = render({"operator": {"metrics": {"enabled": False}}})
    assert "--metrics-port=0" in off.args
    assert [p["name"] for p in off.container["ports"]] == ["healthz"]
    service = render({"operator": {"metrics": {"service": {"enabled": True, "port": 80}}}}).one("Service")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 80, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "operator"


def test_log_level_format_and_extra_flags_reach_the_command_line() -> None:
    rendered = render({"operator": {"logLevel": "debug", "logFormat": "json", "extraArgs": ["--resync-seconds=30"]}})
    assert rendered.args[-3:] == ["--log-format=json", "--verbose", "--resync-seconds=30"]
    assert "--verbose" not in render().args


def test_the_operator_runs_as_non_root_with_a_read_only_root_filesystem() -> None:
    rendered = render()
    pod = rendered.operator["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    container = rendered.container["securityContext"]
    assert container["readOnlyRootFilesystem"] is True and container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}


def test_scheduling_values_reach_the_pod() -> None:
    scheduling = {"nodeSelector": {"pool": "system"}, "tolerations": [{"key": "k", "operator": "Exists"}],
                  "affinity": {"nodeAffinity": {}}, "priorityClassName": "high"}
    pod = render({"operator": scheduling}).operator["spec"]["template"]["spec"]
    assert {k: pod[k] for k in scheduling} == scheduling


def test_never_renders_a_secret_value_into_the_statefulset() -> None:
    reference = {"name": "WEBHOOK_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hooks", "key": "token"}}}
    rendered = render({"operator": {"env": [reference, {"name": "TZ", "value": "UTC"}],
                                    "envFrom": [{"secretRef": {"name": "more"}}]}})
    assert env(rendered)["WEBHOOK_TOKEN"] == reference
    assert not rendered.all("Secret"), "the chart creates no Secret: values are never copied into one"
    # A credential given as a plain value would sit in the pod spec and in Helm's release:
    # the schema refuses it at install time.
    error = render_error({"operator": {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "hunter2"}]}})
    assert "/operator/env/0/value" in error and "secretKeyRef" in error


def test_the_operator_account_can_be_brought_along() -> None:
    rendered = render({"operator": {"serviceAccount": {"create": False, "name": "ops"}}})
    assert not [m for m in rendered.all("ServiceAccount") if m["metadata"]["namespace"] == "pp-system"]
    assert rendered.operator["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    assert rendered.one("ClusterRoleBinding", CLUSTER_ROLE)["subjects"][0]["name"] == "ops"


# ---- the operator's RBAC --------------------------------------------------------------------


def test_the_operator_gets_exactly_the_permissions_its_readme_lists() -> None:
    rendered = render()
    assert rules(rendered.one("ClusterRole", PIPELINES_ROLE)) == {
        ("sparkapp.dev", "persistentpipelines"): {"get", "list", "watch", "patch", "update"},
        ("sparkapp.dev", "persistentpipelines/status"): {"get", "update"},
        ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},
        ("", "pods/log"): {"get"},
        ("", "services"): {"get", "create"},
        ("", "events"): {"create", "patch"},
        ("", "persistentvolumeclaims"): {"get"},
        ("", "serviceaccounts"): {"get"},
    }
    assert rules(rendered.one("ClusterRole", CLUSTER_ROLE)) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("", "namespaces"): {"list", "watch"},
    }


@pytest.mark.parametrize("watch", [[], ["team-a", "team-b", "team-c"]], ids=["cluster-wide", "namespaced"])
def test_the_operator_reads_secrets_only_in_the_job_namespaces(watch: list[str]) -> None:
    rendered = render({"operator": {"watchNamespaces": watch}, "driver": {"jobNamespaces": ["team-a", "team-b"]}})
    assert not [r for role in rendered.all("ClusterRole") for r in rules(role) if r[1] == "secrets"]
    roles = [r for r in rendered.all("Role") if r["metadata"]["name"] == SECRETS_ROLE]
    assert {r["metadata"]["namespace"] for r in roles} == {"team-a", "team-b"}
    assert all(rules(r) == {("", "secrets"): {"get"}} for r in roles)
    for namespace in ("team-a", "team-b"):
        binding = rendered.one("RoleBinding", SECRETS_ROLE, namespace)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SECRETS_ROLE}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "persistent-pipelines-operator",
                                        "namespace": "pp-system"}]


def test_watching_all_namespaces_binds_the_pipeline_permissions_cluster_wide() -> None:
    rendered = render()
    binding = rendered.one("ClusterRoleBinding", PIPELINES_ROLE)
    assert binding["roleRef"]["name"] == PIPELINES_ROLE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "persistent-pipelines-operator",
                                    "namespace": "pp-system"}]
    assert not [a for a in rendered.args if a.startswith("--namespace")]
    assert not rendered.all("RoleBinding") or all(
        b["roleRef"]["name"] != PIPELINES_ROLE for b in rendered.all("RoleBinding"))


def test_watching_listed_namespaces_binds_the_permissions_only_there() -> None:
    rendered = render({"operator": {"watchNamespaces": ["team-a", "team-b"]},
                       "driver": {"jobNamespaces": ["team-a", "team-b"]}})
    assert [a for a in rendered.args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    bindings = [b for b in rendered.all("RoleBinding") if b["roleRef"]["name"] == PIPELINES_ROLE]
    assert {b["metadata"]["namespace"] for b in bindings} == {"team-a", "team-b"}
    assert all(b["roleRef"]["kind"] == "ClusterRole" for b in bindings)
    assert not [b for b in rendered.all("ClusterRoleBinding") if b["roleRef"]["name"] == PIPELINES_ROLE]
    # Cluster-wide, only what kopf needs to start: CRDs and namespaces, list and watch.
    assert rules(rendered.one("ClusterRole", CLUSTER_ROLE)) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("", "namespaces"): {"list", "watch"},
    }


def test_a_job_namespace_the_operator_does_not_watch_fails_the_install() -> None:
    error = render_error({"operator": {"watchNamespaces": ["team-a"]}, "driver": {"jobNamespaces": ["team-b"]}})
    assert '"team-b" is not in operator.watchNamespaces' in error


# ---- the drivers' RBAC ----------------------------------------------------------------------


def test_creates_driver_rbac_in_every_job_namespace() -> None:
    rendered = render({"driver": {"jobNamespaces": ["team-a", "team-b", "team-c"]}})
    for namespace in ("team-a", "team-b", "team-c"):
        account = rendered.one("ServiceAccount", "spark-app-driver", namespace)
        role = rendered.one("Role", DRIVER_ROLE, namespace)
        binding = rendered.one("RoleBinding", DRIVER_ROLE, namespace)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": DRIVER_ROLE}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                        "namespace": namespace}]
        assert role["metadata"]["namespace"] == namespace


EXECUTOR_RULES = {
    ("", "pods"): {"get", "list", "watch", "create", "patch", "delete", "deletecollection"},
    ("", "configmaps"): {"list", "create", "delete", "deletecollection"},
    ("", "services"): {"list", "delete", "deletecollection"},
}


def test_by_default_a_driver_may_only_report_on_its_pod() -> None:
    assert rules(render().one("Role", DRIVER_ROLE, "default")) == {("", "pods"): {"get", "patch"}}


def test_executors_are_granted_only_to_the_namespaces_that_use_kubernetes_execution() -> None:
    rendered = render({"driver": {"jobNamespaces": ["batch", {"name": "spark", "kubernetesExecutors": True}]}})
    assert rules(rendered.one("Role", DRIVER_ROLE, "batch")) == {("", "pods"): {"get", "patch"}}
    assert rules(rendered.one("Role", DRIVER_ROLE, "spark")) == EXECUTOR_RULES
    everywhere = render({"driver": {"jobNamespaces": ["a", {"name": "b", "kubernetesExecutors": False}],
                                    "rbac": {"kubernetesExecutors": True}}})
    assert rules(everywhere.one("Role", DRIVER_ROLE, "a")) == EXECUTOR_RULES
    assert rules(everywhere.one("Role", DRIVER_ROLE, "b")) == {("", "pods"): {"get", "patch"}}


def test_each_job_namespace_may_give_its_drivers_a_cloud_identity_of_its_own() -> None:
    rendered = render({"driver": {
        "serviceAccount": {"annotations": {"team": "data"}},
        "jobNamespaces": [{"name": "ads", "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:ads"}},
                          {"name": "fraud", "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:fraud"}},
                          "scratch"]}})
    annotations = {ns: rendered.one("ServiceAccount", "spark-app-driver", ns)["metadata"].get("annotations")
                   for ns in ("ads", "fraud", "scratch")}
    assert annotations == {"ads": {"team": "data", "eks.amazonaws.com/role-arn": "arn:ads"},
                           "fraud": {"team": "data", "eks.amazonaws.com/role-arn": "arn:fraud"},
                           "scratch": {"team": "data"}}


def test_drivers_never_read_secrets_or_claims_unless_a_rule_is_added() -> None:
    executors = render({"driver": {"rbac": {"kubernetesExecutors": True}}}).one("Role", DRIVER_ROLE, "default")
    assert not {r for _, r in rules(executors)} & {"secrets", "persistentvolumeclaims"}
    extra = {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["list"]}
    role = render({"driver": {"rbac": {"extraRules": [extra]}}}).one("Role", DRIVER_ROLE, "default")
    assert rules(role)[("", "persistentvolumeclaims")] == {"list"}


def test_the_driver_account_is_the_one_the_examples_name() -> None:
    for example in (ROOT / "operator" / "examples").glob("*.yaml"):
        pipeline = yaml.safe_load(example.read_text())
        assert pipeline["spec"]["driver"]["serviceAccountName"] == "spark-app-driver", example.name
    assert render().one("ServiceAccount", "spark-app-driver", "default")


# ---- admission ----------------------------------------------------------------------------


def validations(rendered: Rendered) -> list[str]:
    return [v["message"] for v in rendered.one("ValidatingAdmissionPolicy", PIPELINES_POLICY)["spec"]["validations"]]


def test_the_api_server_refuses_escalating_pipelines_where_the_operator_serves() -> None:
    rendered = render()
    policy = rendered.one("ValidatingAdmissionPolicy", PIPELINES_POLICY)
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["persistentpipelines"]
    messages = " ".join(validations(rendered))
    for field in ("serviceAccountName", "hostNetwork", "hostPID", "hostIPC", "hostPath", "privileged",
                  "allowPrivilegeEscalation", "capabilities.add", "hostPort", "runAsUser", "runAsNonRoot",
                  "seccompProfile", "env[].value"):
        assert field in messages, field
    binding = rendered.one("ValidatingAdmissionPolicyBinding", PIPELINES_POLICY)
    assert binding["spec"] == {"policyName": PIPELINES_POLICY, "validationActions": ["Deny"]}, "all namespaces"
    namespaced = render({"operator": {"watchNamespaces": ["a", "b"]}, "driver": {"jobNamespaces": ["a"]}})
    selector = namespaced.one("ValidatingAdmissionPolicyBinding", PIPELINES_POLICY)["spec"]["matchResources"]
    assert selector["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}]


def test_relaxing_allows_privileges_but_never_another_account_or_plain_keys() -> None:
    relaxed = render({"admission": {"allowPrivilegedPodTemplates": True}})
    messages = " ".join(validations(relaxed))
    assert "hostPath" not in messages and "privileged" not in messages and "hostNetwork" not in messages
    assert "spec.driver.podTemplate.spec.serviceAccountName" in messages and "env[].value" in messages
    assert "--allow-privileged-pod-templates" in relaxed.args and "--allow-privileged-pod-templates" not in render().args


def test_pipelines_may_name_only_the_drivers_account_unless_more_are_listed() -> None:
    account_rule = next(v for v in render().one("ValidatingAdmissionPolicy", PIPELINES_POLICY)["spec"]["validations"]
                        if v["message"].startswith("spec.driver.serviceAccountName:"))
    assert account_rule["expression"].endswith("in [''] + ['spark-app-driver']")
    more = render({"admission": {"driverServiceAccounts": ["spark-gpu"]}}).one("ValidatingAdmissionPolicy",
                                                                               PIPELINES_POLICY)
    assert any(v["expression"].endswith("['spark-app-driver', 'spark-gpu']") for v in more["spec"]["validations"])
    anyone = render({"admission": {"driverServiceAccounts": ["*"]}})
    assert not [m for m in validations(anyone) if m.startswith("spec.driver.serviceAccountName:")]


def test_drivers_may_change_only_their_own_pod_and_executors_in_the_job_namespaces() -> None:
    rendered = render({"driver": {"jobNamespaces": ["a", {"name": "b", "kubernetesExecutors": True}]}})
    policy = rendered.one("ValidatingAdmissionPolicy", DRIVER_PODS_POLICY)
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE", "UPDATE", "DELETE"]
    assert policy["spec"]["matchConditions"] == [{"name": "the-drivers-account", "expression": (
        "request.userInfo.username in ['system:serviceaccount:a:spark-app-driver', "
        "'system:serviceaccount:b:spark-app-driver']")}]
    assert rendered.one("ValidatingAdmissionPolicyBinding", DRIVER_PODS_POLICY)["spec"]["validationActions"] == ["Deny"]


def test_admission_policies_can_be_left_out() -> None:
    rendered = render({"admission": {"enabled": False}})
    assert not rendered.all("ValidatingAdmissionPolicy") and not rendered.all("ValidatingAdmissionPolicyBinding")


# ---- values: documented, typed, refused when wrong ------------------------------------------------


@pytest.mark.parametrize(("values", "where"), [
    ({"operator": {"replicas": "two"}}, "/operator/replicas"),
    ({"operator": {"replcas": 2}}, "replcas"),
    ({"operator": {"image": {"pullPolicy": "Sometimes"}}}, "/operator/image/pullPolicy"),
    ({"operator": {"logLevel": "trace"}}, "/operator/logLevel"),
    ({"operator": {"livenessPort": 70000}}, "/operator/livenessPort"),
    ({"operator": {"watchNamespaces": ["Team_A"]}}, "/operator/watchNamespaces/0"),
    ({"driver": {"jobNamespaces": ["default", "default"]}}, "/driver/jobNamespaces"),
    ({"driver": {"jobNamespaces": [{"name": "a", "executors": True}]}}, "/driver/jobNamespaces/0"),
    ({"driver": {"jobNamespaces": [{"name": "a"}, "a"]}}, "driver.jobNamespaces: a namespace is listed twice"),
    ({"admission": {"driverServiceAccounts": ["Admin"]}}, "/admission/driverServiceAccounts/0"),
    ({"driver": {"serviceAccount": {"name": ""}}}, "/driver/serviceAccount/name"),
    ({"operator": {"extraArgs": ["resync=3"]}}, "/operator/extraArgs/0"),
])
def test_a_bad_value_fails_at_install_time(values: dict[str, Any], where: str) -> None:
    assert where in render_error(values)


def test_no_job_namespace_fails_at_install_time() -> None:
    assert "driver.jobNamespaces is empty" in render_error({"driver": {"jobNamespaces": []}})


def test_every_value_is_in_the_schema_which_allows_no_other() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def check(node: dict[str, Any], value: Any, path: str) -> None:
        if node.get("type") != "object" or "properties" not in node:
            return
        assert node.get("additionalProperties") is False, f"{path or 'values'} accepts unknown keys"
        for key, child in value.items():
            assert key in node["properties"], f"{path}.{key} is missing from values.schema.json"
            check(node["properties"][key], child, f"{path}.{key}".lstrip("."))

    check(schema, values, "")


def test_every_value_is_documented_and_the_readme_table_is_current() -> None:
    import sys

    sys.path.insert(0, str(ROOT / "charts"))
    import values_doc

    documented = values_doc.documented_values((CHART / "values.yaml").read_text())
    assert len(documented) > 40
    readme = (CHART / "README.md").read_text()
    assert values_doc.render(readme, documented) == readme, "run make chart-docs"


def test_an_undocumented_value_is_caught() -> None:
    import sys

    sys.path.insert(0, str(ROOT / "charts"))
    import values_doc

    with pytest.raises(values_doc.Undocumented, match="operator.newKey"):
        values_doc.documented_values("operator:\n  # -- documented\n  replicas: 1\n  newKey: 2\n")
