"""What the pods the operator builds may do, in two halves of one policy.

* What they start from: Pod Security "restricted" (a non-root uid, no privilege
  escalation, every capability dropped, the runtime's seccomp profile) with a read-only
  root filesystem and emptyDirs for what Spark and Python write. Driver pods, the state
  cleanup pod and the executors' pod template are all built on it; a pod template merges
  over it, so it may pick another non-root uid or a bigger scratch volume.
* What a pipeline author may not ask for (``template_problems``, ``spark_conf_problems``):
  anything that would let a PersistentPipeline get a pod its author could not create
  (the confused deputy): host namespaces, host paths and ports, privileges, root, another
  service account, credentials as plain values. The chart's ValidatingAdmissionPolicy
  refuses the same at ``kubectl apply`` time
  (charts/persistent-pipelines/templates/admission/pipelines.yaml); the operator checks
  again for a cluster without it. tests/support/escalations.py holds the cases that
  both are tested with.

Pure: values in, dicts and problems out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline_operator.errors import Problem
from spark_app import contract

JsonDict = dict[str, Any]

SPARK_APP_UID = 185
"""The spark-app image's user (Dockerfile), the same as Apache Spark's own images."""
TMP_VOLUME, LOCAL_VOLUME, CACHE_VOLUME = "tmp", "spark-local", "cache"
LOCAL_DIR = "/var/lib/spark-app/local"
"""Spark's scratch space (spark.local.dir): shuffle files and spills."""
CACHE_DIR = "/var/cache/spark-app"
"""Caches of tools that would write under the (read-only) home folder: Ivy, XDG."""
SCRATCH = ((TMP_VOLUME, "/tmp"), (LOCAL_VOLUME, LOCAL_DIR), (CACHE_VOLUME, CACHE_DIR))
RELAX_HINT = "(a cluster administrator may allow it with the chart value admission.allowPrivilegedPodTemplates)"
TEMPLATE = "spec.driver.podTemplate.spec"
CREDENTIAL_ENV = frozenset({contract.AWS_ACCESS_KEY_ID, contract.AWS_SECRET_ACCESS_KEY, contract.AWS_SESSION_TOKEN})
_CONTAINER_LISTS = ("initContainers", "containers")
_HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")


# ---- what every pod starts from -----------------------------------------------------------


def pod_security_context() -> JsonDict:
    return {
        "runAsNonRoot": True,
        "runAsUser": SPARK_APP_UID,
        "runAsGroup": SPARK_APP_UID,
        # Claims are written by that user: the kubelet gives their files its group, and
        # checks only the claim's root on later mounts.
        "fsGroup": SPARK_APP_UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> JsonDict:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def scratch_volumes() -> list[JsonDict]:
    return [{"name": name, "emptyDir": {}} for name, _ in SCRATCH]


def scratch_mounts() -> list[JsonDict]:
    return [{"name": name, "mountPath": path} for name, path in SCRATCH]


def scratch_env() -> list[JsonDict]:
    return [{"name": "XDG_CACHE_HOME", "value": CACHE_DIR}]


def scratch_spark_conf() -> dict[str, str]:
    """Where Spark writes, away from the read-only root (the working directory included,
    where the session catalog would create spark-warehouse)."""
    return {
        "spark.local.dir": LOCAL_DIR,
        "spark.jars.ivy": f"{CACHE_DIR}/ivy",
        "spark.sql.warehouse.dir": "/tmp/spark-warehouse",
    }


def restricted_base(template: Mapping[str, Any], main_container: str) -> JsonDict:
    """The pod a template is merged over: the restricted security contexts for the pod,
    for ``main_container`` and for every container the template names, and the scratch
    volumes mounted in ``main_container``."""
    spec = template.get("spec") or {}
    base_spec: JsonDict = {"securityContext": pod_security_context(), "volumes": scratch_volumes()}
    for kind in _CONTAINER_LISTS:
        named = [c["name"] for c in spec.get(kind) or [] if isinstance(c, Mapping) and isinstance(c.get("name"), str)]
        if kind == "containers" and main_container not in named:
            named.insert(0, main_container)
        if named:
            base_spec[kind] = [{"name": name, "securityContext": container_security_context(),
                                **({"volumeMounts": scratch_mounts()} if name == main_container else {})}
                               for name in named]
    return {"spec": base_spec}


# ---- what a pipeline author may not ask for ------------------------------------------------


def template_problems(template: Mapping[str, Any], *, allow_privileged: bool) -> list[Problem]:
    """What spec.driver.podTemplate asks for that a pipeline may not have. With
    ``allow_privileged`` (the chart's admission.allowPrivilegedPodTemplates) only the
    account and the credentials are checked."""
    spec = template.get("spec") or {}
    if not isinstance(spec, Mapping):
        return [Problem(TEMPLATE, "must be an object (a Pod's spec)")]
    problems = []
    for key in ("serviceAccountName", "serviceAccount"):
        if key in spec:
            problems.append(Problem(f"{TEMPLATE}.{key}", "is not allowed: the driver's account comes only from "
                                                         "spec.driver.serviceAccountName"))
    for kind, container in _containers(spec):
        for var in container.get("env") or []:
            if isinstance(var, Mapping) and var.get("name") in CREDENTIAL_ENV and "value" in var:
                problems.append(Problem(f"{TEMPLATE}.{kind}[{container.get('name')}].env[{var['name']}].value",
                                        credential_message(str(var["name"]))))
    if not allow_privileged:
        problems += _privilege_problems(spec)
    return problems


def spark_conf_problems(conf: Mapping[str, Any], *, allow_privileged: bool) -> list[Problem]:
    """Spark settings that would give executors what a template may not have (Spark, not
    the operator, builds the executor pods, with the driver's account)."""
    problems = []
    for key in conf:
        if key.startswith("spark.kubernetes.authenticate."):
            problems.append(Problem(f"spec.application.sparkConf.{key}",
                                    "is set by the operator: the driver's and its executors' account comes only "
                                    "from spec.driver.serviceAccountName"))
        elif key.startswith("spark.kubernetes.executor.volumes.hostPath.") and not allow_privileged:
            problems.append(Problem(f"spec.application.sparkConf.{key}",
                                    f"hostPath volumes are not allowed: they expose the node's filesystem; "
                                    f"use a persistentVolumeClaim {RELAX_HINT}"))
    return problems


def credential_message(variable: str) -> str:
    return f"{variable} must come from a Secret (valueFrom.secretKeyRef), never as a plain value"


def _privilege_problems(spec: Mapping[str, Any]) -> list[Problem]:
    problems = [Problem(f"{TEMPLATE}.{key}", f"host namespaces are not allowed: the driver would share the node's "
                                             f"network, processes or IPC {RELAX_HINT}")
                for key in _HOST_NAMESPACES if spec.get(key) is True]
    problems += [Problem(f"{TEMPLATE}.volumes[{volume.get('name')}].hostPath",
                         f"hostPath volumes are not allowed: they expose the node's filesystem; use a "
                         f"persistentVolumeClaim {RELAX_HINT}")
                 for volume in spec.get("volumes") or [] if isinstance(volume, Mapping) and "hostPath" in volume]
    problems += _context_problems(f"{TEMPLATE}.securityContext", spec.get("securityContext"))
    for kind, container in _containers(spec):
        where = f"{TEMPLATE}.{kind}[{container.get('name')}]"
        context = container.get("securityContext")
        problems += _context_problems(f"{where}.securityContext", context)
        if isinstance(context, Mapping):
            if context.get("privileged") is True:
                problems.append(Problem(f"{where}.securityContext.privileged",
                                        f"privileged containers are not allowed: they hold every power of the "
                                        f"node {RELAX_HINT}"))
            if context.get("allowPrivilegeEscalation") is True:
                problems.append(Problem(f"{where}.securityContext.allowPrivilegeEscalation",
                                        f"must not be true: pipelines run without privilege escalation {RELAX_HINT}"))
            if ((context.get("capabilities") or {}).get("add") or []):
                problems.append(Problem(f"{where}.securityContext.capabilities.add",
                                        f"added capabilities are not allowed: pipelines run with every capability "
                                        f"dropped {RELAX_HINT}"))
        for port in container.get("ports") or []:
            if isinstance(port, Mapping) and port.get("hostPort"):
                problems.append(Problem(f"{where}.ports[{port.get('name') or port.get('containerPort')}].hostPort",
                                        f"host ports are not allowed: they bind the node's network {RELAX_HINT}"))
    return problems


def _context_problems(where: str, context: Any) -> list[Problem]:
    """What a pod's or a container's securityContext may not say."""
    if not isinstance(context, Mapping):
        return []
    problems = []
    if context.get("runAsUser") == 0:
        problems.append(Problem(f"{where}.runAsUser", f"must not be 0: pipelines do not run as root {RELAX_HINT}"))
    if context.get("runAsNonRoot") is False:
        problems.append(Problem(f"{where}.runAsNonRoot", f"must not be false: pipelines run as a non-root user "
                                                         f"{RELAX_HINT}"))
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        problems.append(Problem(f"{where}.seccompProfile.type", f"must not be Unconfined: use RuntimeDefault or "
                                                                f"Localhost {RELAX_HINT}"))
    return problems


def _containers(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(kind, c) for kind in _CONTAINER_LISTS for c in spec.get(kind) or [] if isinstance(c, Mapping)]

