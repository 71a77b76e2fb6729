"""Pure builders of what the operator creates: the driver pod, its headless Service, the
state cleanup pod, the executors' pod template (Kubernetes execution), and the
configuration injected into the driver (spark_app.contract). Every pod starts from
Pod Security "restricted" (pipeline_operator.podsecurity), with its template merged over it.

Every function takes values and returns plain dicts; tests call them directly.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from pipeline_operator import names, podsecurity
from pipeline_operator.spec import FilesystemBackend, PipelineSpec, S3Backend, uri_in_pod
from spark_app import contract
from spark_app.contract import InjectedConfig

STATE_VOLUME = "state"
LIVE_SETTINGS_VOLUME = "live-settings"
JsonDict = dict[str, Any]


def owner_reference(resource: Mapping[str, Any]) -> JsonDict:
    """Makes the PersistentPipeline the controller of a created object (garbage-collected with it)."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": resource["metadata"]["name"],
        "uid": resource["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def spark_conf(spec: PipelineSpec, epoch: int) -> dict[str, str]:
    """The Spark settings of a driver: the spec's sparkConf, overridden by the execution
    mode's (the master, where the driver is, executor counts), so that sparkConf cannot
    move the driver out of its pod."""
    conf = {**podsecurity.scratch_spark_conf(), **{k: str(v) for k, v in spec.application.spark_conf.items()}}
    execution = spec.execution
    if execution.mode == "Local":
        conf["spark.master"] = f"local[{execution.local_threads}]"
        return conf
    # Client mode inside our own pod: executors are owned by the driver pod (Spark sets the
    # owner reference from spark.kubernetes.driver.pod.name) and go away with it.
    conf.update({
        "spark.master": "k8s://https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)",
        "spark.submit.deployMode": "client",
        "spark.kubernetes.namespace": spec.namespace,
        "spark.kubernetes.driver.pod.name": names.driver_pod_name(spec.name),
        "spark.kubernetes.container.image": spec.image,
        "spark.kubernetes.container.image.pullPolicy": spec.image_pull_policy,
        "spark.driver.host": f"$({names.POD_IP_ENV})",
        "spark.driver.bindAddress": "0.0.0.0",
        "spark.driver.port": str(execution.driver_port),
        "spark.blockManager.port": str(execution.block_manager_port),
        f"spark.kubernetes.executor.label.{names.LABEL_PIPELINE}": spec.name,
        f"spark.kubernetes.executor.label.{names.LABEL_ROLE}": "executor",
        f"spark.kubernetes.executor.annotation.{names.ANNOTATION_EPOCH}": str(epoch),
    })
    conf["spark.executor.instances"] = str(execution.executors.instances)
    conf["spark.executor.cores"] = str(execution.executors.cores)
    conf["spark.executor.memory"] = execution.executors.memory
    if spec.driver.service_account_name:
        conf["spark.kubernetes.authenticate.driver.serviceAccountName"] = spec.driver.service_account_name
    backend = spec.persistence.backend
    if isinstance(backend, FilesystemBackend):
        # Executors write the state stores under the checkpoint: they need the claim too, at
        # the same path (on a multi-node cluster it must then be ReadWriteMany).
        volume = f"spark.kubernetes.executor.volumes.persistentVolumeClaim.{STATE_VOLUME}"
        conf[f"{volume}.options.claimName"] = backend.claim_name
        conf[f"{volume}.mount.path"] = names.STATE_MOUNT_PATH
    return conf


def injected_config(spec: PipelineSpec, *, epoch: int, state_root: str,
                    tables: tuple[contract.TableInput, ...] = ()) -> InjectedConfig:
    """What the driver reads with spark_app.persistence.Config.from_env(); ``tables``: the
    shared tables it reads, as pipeline_operator.policy.resolve_inputs found them."""
    backend = spec.persistence.backend
    s3 = backend if isinstance(backend, S3Backend) else None
    return InjectedConfig(
        metadata_uri=uri_in_pod(state_root),
        snapshot_uri=uri_in_pod(state_root),
        snapshot_interval_ms=spec.persistence.snapshot_interval_seconds * 1000,
        epoch=epoch,
        pipeline=spec.pipeline,
        s3=s3.options if s3 else contract.S3Options(),
        spark_conf=spark_conf(spec, epoch),
        dead_letter_uri=spec.application.dead_letter_uri,
        outage_budget_seconds=spec.persistence.outage_budget_seconds,
        max_files_per_trigger=spec.application.max_files_per_trigger,
        max_bytes_per_trigger=spec.application.max_bytes_per_trigger,
        table_inputs=tables,
        tables={t.name: contract.TableSettings(max_hold_age_seconds=t.max_hold_age_seconds) for t in spec.tables},
    )


def driver_pod(spec: PipelineSpec, *, epoch: int, state_root: str, owner: JsonDict,
               tables: tuple[contract.TableInput, ...] = ()) -> JsonDict:
    """The driver pod of one epoch. restartPolicy Never: the operator, not the kubelet,
    decides on relaunches, each with a new epoch."""
    app = spec.application
    target = ["-m", app.module] if app.module else [app.file or ""]
    env = [
        # Downward API first: the variables below refer to them with $(...).
        _field_env(contract.POD_NAME, "metadata.name"),
        _field_env(contract.POD_NAMESPACE, "metadata.namespace"),
        _field_env(names.POD_IP_ENV, "status.podIP"),
        *_credential_env(spec),
        *_kafka_env(spec),
        *podsecurity.scratch_env(),
        *(dict(var) for var in spec.driver.env),
        *({"name": k, "value": v}
          for k, v in injected_config(spec, epoch=epoch, state_root=state_root, tables=tables).to_env().items()),
    ]
    env.append({"name": contract.LIVE_SETTINGS_FILE,
                "value": f"{names.LIVE_SETTINGS_MOUNT_PATH}/{names.LIVE_SETTINGS_FILE_NAME}"})
    if spec.execution.mode == "Kubernetes":
        env.append({"name": contract.EXECUTOR_POD_TEMPLATE,
                    "value": json.dumps(executor_pod_template(spec), sort_keys=True)})
    container: JsonDict = {
        "name": names.DRIVER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": ["driver", *target, *app.args],
        "env": env,
        "resources": copy.deepcopy(dict(spec.driver.resources)),
        "terminationMessagePath": contract.TERMINATION_LOG,
        # Kubernetes falls back to the log's tail when the driver died before writing one.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [*_state_mounts(spec), *_kafka_mounts(spec),
                         {"name": LIVE_SETTINGS_VOLUME, "mountPath": names.LIVE_SETTINGS_MOUNT_PATH,
                          "readOnly": True}],
    }
    if spec.execution.mode == "Kubernetes":
        container["ports"] = [
            {"name": "driver-rpc", "containerPort": spec.execution.driver_port},
            {"name": "blockmanager", "containerPort": spec.execution.block_manager_port},
        ]
    pod_spec: JsonDict = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": spec.driver.termination_grace_period_seconds,
        "containers": [container],
        "volumes": [*_state_volumes(spec), *_kafka_volumes(spec), _live_settings_volume()],
    }
    if spec.driver.service_account_name:
        pod_spec["serviceAccountName"] = spec.driver.service_account_name
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.driver_pod_name(spec.name),
            "namespace": spec.namespace,
            "labels": names.labels(spec.name, names.ROLE_DRIVER),
            "annotations": {
                names.ANNOTATION_EPOCH: str(epoch),
                names.ANNOTATION_SPEC_HASH: spec.pod_hash,
                names.ANNOTATION_RESTART_NONCE: spec.restart_nonce,
                names.ANNOTATION_STATE_ROOT: state_root,
                contract.LIVE_SETTINGS_ANNOTATION: spec.live_settings.to_json(),
            },
            "ownerReferences": [owner],
        },
        "spec": pod_spec,
    }
    merged: JsonDict = merge(_under_template(spec, names.DRIVER_CONTAINER), pod)
    return merged


def executor_pod_template(spec: PipelineSpec) -> JsonDict:
    """The Pod Spark builds each executor from (spark.kubernetes.executor.podTemplateFile):
    restricted like the driver, with the S3 credentials as the same Secret references
    (executors write the state stores into the checkpoint) and no API token (executors
    never call the API server). Spark adds its own emptyDir for spark.local.dir."""
    scratch = [(volume, path) for volume, path in podsecurity.SCRATCH if volume != podsecurity.LOCAL_VOLUME]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            "securityContext": podsecurity.pod_security_context(),
            "automountServiceAccountToken": False,
            "volumes": [{"name": volume, "emptyDir": {}} for volume, _ in scratch],
            "containers": [{
                "name": contract.EXECUTOR_CONTAINER,
                "securityContext": podsecurity.container_security_context(),
                "volumeMounts": [{"name": volume, "mountPath": path} for volume, path in scratch],
                "env": [*_credential_env(spec), *_s3_env(spec), *podsecurity.scratch_env()],
            }],
        },
    }


def driver_service(spec: PipelineSpec, *, owner: JsonDict) -> JsonDict:
    """A headless Service in front of the driver, for executors and for kubectl users."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.driver_service_name(spec.name),
            "namespace": spec.namespace,
            "labels": names.labels(spec.name, names.ROLE_DRIVER),
            "ownerReferences": [owner],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {names.LABEL_PIPELINE: spec.name, names.LABEL_ROLE: names.ROLE_DRIVER},
            "ports": [
                {"name": "driver-rpc", "port": spec.execution.driver_port},
                {"name": "blockmanager", "port": spec.execution.block_manager_port},
            ],
        },
    }


def cleanup_pod(spec: PipelineSpec, *, owner: JsonDict, tables: tuple[contract.TableInput, ...] = ()) -> JsonDict:
    """What a deleted pipeline leaves to do, with the runtime's own commands, in a pod so
    that it can reach a claim the operator does not mount, with the same Secret references
    as the driver: release its holds on the shared ``tables`` it read (`spark_app tables
    release`), then, with onDelete: Delete, delete its stored state (every reset and
    generation below its base, `spark_app reset`)."""
    env = [*_credential_env(spec), *_s3_env(spec)]
    template = {"spec": {k: v for k, v in dict(spec.driver.pod_template).get("spec", {}).items()
                         if k not in ("containers", "initContainers")}}

    def container(name: str, args: list[str], extra_env: list[JsonDict]) -> JsonDict:
        return {"name": name, "image": spec.image, "imagePullPolicy": spec.image_pull_policy,
                "args": ["python", "-m", "spark_app", *args], "env": [*env, *extra_env],
                "volumeMounts": _state_mounts(spec)}

    steps = []
    if tables:
        steps.append(container(names.RELEASE_CONTAINER, ["tables", "release", "--reader", spec.pipeline],
                               [{"name": k, "value": v} for k, v in contract.tables_to_env(tables, {}).items()]))
    if spec.persistence.on_delete == "Delete" or not tables:
        steps.append(container(names.CLEANUP_CONTAINER, ["reset", uri_in_pod(spec.persistence.base_uri), "--yes"],
                               []))
    under = merge(podsecurity.restricted_base(template, steps[-1]["name"]), template)
    for step in steps[:-1]:
        step["securityContext"] = podsecurity.container_security_context()
        step["volumeMounts"] = [*step["volumeMounts"], *podsecurity.scratch_mounts()]
    pod_spec: JsonDict = {
        "restartPolicy": "OnFailure",
        # One step after the other: the holds go first, then the state that named them.
        **({"initContainers": steps[:-1]} if len(steps) > 1 else {}),
        "containers": steps[-1:],
        "volumes": _state_volumes(spec),
    }
    if spec.driver.service_account_name:
        pod_spec["serviceAccountName"] = spec.driver.service_account_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.cleanup_pod_name(spec.name),
            "namespace": spec.namespace,
            "labels": names.labels(spec.name, names.ROLE_CLEANUP),
            "ownerReferences": [owner],
        },
        "spec": merge(under["spec"], pod_spec),
    }


def merge(base: Any, override: Any) -> Any:
    """Overlays ``override`` on ``base`` (a pod template): objects merge key by key, lists
    of named objects (containers, volumes, env, mounts, ports) merge by name, and anything
    else in ``override`` replaces what ``base`` has."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = {k: copy.deepcopy(v) for k, v in base.items()}
        for key, value in override.items():
            merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if _named_list(base) and _named_list(override):
        by_name = {item["name"]: item for item in override}
        merged_list = [merge(item, by_name.pop(item["name"])) if item["name"] in by_name else copy.deepcopy(item)
                       for item in base]
        return merged_list + [copy.deepcopy(item) for item in override if item["name"] in by_name]
    return copy.deepcopy(override)


def _under_template(spec: PipelineSpec, main_container: str) -> JsonDict:
    """The pipeline's pod template merged over the restricted base, ready for the operator's own fields."""
    template = dict(spec.driver.pod_template)
    return dict(merge(podsecurity.restricted_base(template, main_container), template))


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, Mapping) and "name" in i for i in value)


def _field_env(name: str, path: str) -> JsonDict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _credential_env(spec: PipelineSpec) -> list[JsonDict]:
    """S3 credentials, only ever as secretKeyRef: the values never pass through the operator."""
    backend = spec.persistence.backend
    if not isinstance(backend, S3Backend) or backend.credentials is None:
        return []
    creds = backend.credentials
    pairs = [(contract.AWS_ACCESS_KEY_ID, creds.access_key_id_key),
             (contract.AWS_SECRET_ACCESS_KEY, creds.secret_access_key_key)]
    if creds.session_token_key:
        pairs.append((contract.AWS_SESSION_TOKEN, creds.session_token_key))
    return [{"name": var, "valueFrom": {"secretKeyRef": {"name": creds.secret_name, "key": key}}}
            for var, key in pairs]


KAFKA_CA_VOLUME = "kafka-ca"
KAFKA_CA_FILE = "ca.crt"


def _kafka_env(spec: PipelineSpec) -> list[JsonDict]:
    """spec.kafka for the driver: settings as values, the SASL username and password only
    ever as secretKeyRef, the CA as the path of its mounted file."""
    kafka = spec.kafka
    if kafka is None:
        return []
    env: list[JsonDict] = [{"name": contract.KAFKA_BOOTSTRAP_SERVERS, "value": kafka.bootstrap_servers},
           {"name": contract.KAFKA_SECURITY_PROTOCOL, "value": kafka.security_protocol}]
    if kafka.sasl_mechanism:
        env.append({"name": contract.KAFKA_SASL_MECHANISM, "value": kafka.sasl_mechanism})
    if kafka.credentials is not None:
        creds = kafka.credentials
        env += [{"name": var, "valueFrom": {"secretKeyRef": {"name": creds.secret_name, "key": key}}}
                for var, key in ((contract.KAFKA_SASL_USERNAME, creds.username_key),
                                 (contract.KAFKA_SASL_PASSWORD, creds.password_key))]
    if kafka.ca is not None:
        env.append({"name": contract.KAFKA_CA_FILE, "value": f"{contract.KAFKA_CA_MOUNT}/{KAFKA_CA_FILE}"})
    return env


def _kafka_volumes(spec: PipelineSpec) -> list[JsonDict]:
    ca = spec.kafka.ca if spec.kafka else None
    if ca is None:
        return []
    items = [{"key": ca.key, "path": KAFKA_CA_FILE}]
    if ca.kind == "Secret":
        return [{"name": KAFKA_CA_VOLUME, "secret": {"secretName": ca.name, "items": items}}]
    return [{"name": KAFKA_CA_VOLUME, "configMap": {"name": ca.name, "items": items}}]


def _kafka_mounts(spec: PipelineSpec) -> list[JsonDict]:
    if spec.kafka is None or spec.kafka.ca is None:
        return []
    return [{"name": KAFKA_CA_VOLUME, "mountPath": contract.KAFKA_CA_MOUNT, "readOnly": True}]


def _s3_env(spec: PipelineSpec) -> list[JsonDict]:
    """Where the S3 server is, for pods other than the driver (which gets InjectedConfig)."""
    s3 = spec.persistence.backend if isinstance(spec.persistence.backend, S3Backend) else None
    if s3 is None:
        return []
    return [{"name": name, "value": value} for name, value in sorted(s3.options.to_env().items())]


def _live_settings_volume() -> JsonDict:
    """The pod's live settings annotation as a file: the kubelet rewrites it when the
    operator changes the annotation, and the running driver reads it again."""
    return {"name": LIVE_SETTINGS_VOLUME, "downwardAPI": {"items": [{
        "path": names.LIVE_SETTINGS_FILE_NAME,
        "fieldRef": {"fieldPath": f"metadata.annotations['{contract.LIVE_SETTINGS_ANNOTATION}']"},
    }]}}


def _state_volumes(spec: PipelineSpec) -> list[JsonDict]:
    backend = spec.persistence.backend
    if isinstance(backend, FilesystemBackend):
        return [{"name": STATE_VOLUME, "persistentVolumeClaim": {"claimName": backend.claim_name}}]
    return []


def _state_mounts(spec: PipelineSpec) -> list[JsonDict]:
    if isinstance(spec.persistence.backend, FilesystemBackend):
        return [{"name": STATE_VOLUME, "mountPath": names.STATE_MOUNT_PATH}]
    return []
