"""What a pipeline author may not ask for, case by case, and a plain spec that asks for
nothing of it. One table for both checks of the same rules, so that they stay in step:
the operator's own (pipeline_operator.podsecurity, tests/unit/operator/test_operator_podsecurity.py)
and the chart's ValidatingAdmissionPolicy on the real API server
(tests/integration/operator/test_operator_cluster_security.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TEMPLATE = "spec.driver.podTemplate.spec"


@dataclass(frozen=True)
class Escalation:
    name: str
    spec: dict[str, Any]
    """Spec sections (driver, application) that replace those of a plain spec."""
    field: str
    """The field the refusal names."""
    relaxable: bool = True
    """Allowed with the chart value admission.allowPrivilegedPodTemplates (and the
    operator's --allow-privileged-pod-templates)."""


def template(**pod_spec: Any) -> dict[str, Any]:
    return {"driver": {"serviceAccountName": "spark-app-driver", "podTemplate": {"spec": pod_spec}}}


def driver(**security: Any) -> dict[str, Any]:
    """A template whose driver container has this securityContext."""
    return template(containers=[{"name": "driver", "securityContext": security}])


ESCALATIONS = [
    Escalation("a service account in the template", template(serviceAccountName="admin"),
               f"{TEMPLATE}.serviceAccountName", relaxable=False),
    Escalation("a hostPath volume", template(volumes=[{"name": "host", "hostPath": {"path": "/"}}]),
               f"{TEMPLATE}.volumes[host].hostPath"),
    Escalation("a privileged container", driver(privileged=True),
               f"{TEMPLATE}.containers[driver].securityContext.privileged"),
    Escalation("privilege escalation in a sidecar",
               template(containers=[{"name": "sidecar", "image": "busybox",
                                     "securityContext": {"allowPrivilegeEscalation": True}}]),
               f"{TEMPLATE}.containers[sidecar].securityContext.allowPrivilegeEscalation"),
    Escalation("the host's network", template(hostNetwork=True), f"{TEMPLATE}.hostNetwork"),
    Escalation("the host's processes", template(hostPID=True), f"{TEMPLATE}.hostPID"),
    Escalation("the host's IPC", template(hostIPC=True), f"{TEMPLATE}.hostIPC"),
    Escalation("an added capability", driver(capabilities={"add": ["NET_ADMIN"]}),
               f"{TEMPLATE}.containers[driver].securityContext.capabilities.add"),
    Escalation("a host port", template(containers=[{"name": "driver", "ports": [
        {"name": "debug", "containerPort": 5005, "hostPort": 5005}]}]),
               f"{TEMPLATE}.containers[driver].ports[debug].hostPort"),
    Escalation("root for the pod", template(securityContext={"runAsUser": 0}), f"{TEMPLATE}.securityContext.runAsUser"),
    Escalation("root for an init container",
               template(initContainers=[{"name": "setup", "image": "busybox", "securityContext": {"runAsUser": 0}}]),
               f"{TEMPLATE}.initContainers[setup].securityContext.runAsUser"),
    Escalation("runAsNonRoot false", driver(runAsNonRoot=False),
               f"{TEMPLATE}.containers[driver].securityContext.runAsNonRoot"),
    Escalation("an unconfined seccomp profile", template(securityContext={"seccompProfile": {"type": "Unconfined"}}),
               f"{TEMPLATE}.securityContext.seccompProfile.type"),
    Escalation("a plain AWS secret key in the template's env",
               template(containers=[{"name": "driver", "env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}]}]),
               f"{TEMPLATE}.containers[driver].env[AWS_SECRET_ACCESS_KEY].value", relaxable=False),
    Escalation("a plain AWS key id in driver.env",
               {"driver": {"env": [{"name": "AWS_ACCESS_KEY_ID", "value": "AKIAIOSFODNN7EXAMPLE"}]}},
               "spec.driver.env[AWS_ACCESS_KEY_ID].value", relaxable=False),
    Escalation("a hostPath volume for executors",
               {"application": {"file": "examples/wordcount.py", "sparkConf": {
                   "spark.kubernetes.executor.volumes.hostPath.host.mount.path": "/host"}}},
               "spec.application.sparkConf.spark.kubernetes.executor.volumes.hostPath.host.mount.path"),
    Escalation("another account for executors",
               {"application": {"file": "examples/wordcount.py", "sparkConf": {
                   "spark.kubernetes.authenticate.executor.serviceAccountName": "admin"}}},
               "spec.application.sparkConf.spark.kubernetes.authenticate.executor.serviceAccountName",
               relaxable=False),
]

# Everything a pipeline usually asks for: volumes from claims, mounts, env from a Secret,
# node selection, another non-root uid, its own scratch volume, a sidecar.
PLAIN: dict[str, Any] = {
    "driver": {
        "serviceAccountName": "spark-app-driver",
        "env": [{"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}}],
        "podTemplate": {
            "metadata": {"labels": {"team": "ads"}},
            "spec": {
                "nodeSelector": {"pool": "spark"},
                "tolerations": [{"key": "spark", "operator": "Exists"}],
                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                            {"name": "spark-local", "emptyDir": {"sizeLimit": "20Gi"}}],
                "containers": [
                    {"name": "driver", "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                     "env": [{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}],
                     "ports": [{"name": "ui", "containerPort": 4040}],
                     "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}},
                    {"name": "sidecar", "image": "busybox", "command": ["sleep", "infinity"]},
                ],
            },
        },
    },
    "application": {"file": "examples/wordcount.py", "sparkConf": {
        "spark.kubernetes.executor.secretKeyRef.DB_PASSWORD": "db:pw",
        "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.options.claimName": "data",
        "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.mount.path": "/data"}},
}
