"""The pure builders: the driver pod, its Service, the cleanup pod, and both sides of the
contract: the env a driver pod gets is what spark_app's Config.from_env() reads."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pipeline_operator import builders, names, podsecurity
from pipeline_operator.spec import PipelineSpec
from ppl_factories import NAME, NAMESPACE, S3_SPEC, spec

from spark_app import contract
from spark_app.persistence import Backend, Config

OWNER = {"apiVersion": "sparkapp.dev/v1alpha1", "kind": "PersistentPipeline", "name": NAME, "uid": "uid-ppl",
         "controller": True, "blockOwnerDeletion": True}
SECRETS = {("s3-creds", "AWS_ACCESS_KEY_ID"): "AKIAEXAMPLE", ("s3-creds", "AWS_SECRET_ACCESS_KEY"): "hunter2",
           ("kafka-user", "username"): "kafka-login", ("kafka-user", "password"): "kafka-hunter2"}
SERVICE_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def container_env(pod: dict[str, Any], pod_ip: str = "10.1.2.3") -> dict[str, str]:
    """The environment the kubelet gives the driver: fieldRef and secretKeyRef resolved,
    $(VAR) expanded against the variables defined before (and the service variables)."""
    fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
              "status.podIP": pod_ip}
    env: dict[str, str] = dict(SERVICE_ENV)
    for var in pod["spec"]["containers"][0]["env"]:
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), var["value"])
        elif "fieldRef" in source:
            env[var["name"]] = fields[source["fieldRef"]["fieldPath"]]
        else:
            ref = source["secretKeyRef"]
            env[var["name"]] = SECRETS[(ref["name"], ref["key"])]
    return env


def driver_pod(s: PipelineSpec, epoch: int = 3, root: str | None = None) -> dict[str, Any]:
    return builders.driver_pod(s, epoch=epoch, state_root=root or s.persistence.base_uri, owner=OWNER)


# ---- the contract, both sides ---------------------------------------------------------------


def test_a_kafka_driver_reads_the_connection_the_operator_meant_with_credentials_only_from_the_secret() -> None:
    s = spec(kafka={"bootstrapServers": "kafka:9093", "securityProtocol": "SASL_SSL",
                    "sasl": {"mechanism": "SCRAM-SHA-256", "credentialsSecret": {"name": "kafka-user"}},
                    "tls": {"caSecret": {"name": "kafka-ca", "key": "bundle.pem"}}})
    pod = driver_pod(s)
    connection = contract.DriverEnvironment.from_env(container_env(pod)).kafka
    assert connection == contract.KafkaConnection("kafka:9093", "SASL_SSL", "SCRAM-SHA-256", "kafka-login",
                                                  "kafka-hunter2", "/etc/spark-app/kafka-ca/ca.crt")
    assert "kafka-hunter2" not in json.dumps(pod) and "kafka-login" not in json.dumps(pod)
    assert {"name": "kafka-ca", "secret": {"secretName": "kafka-ca", "items": [{"key": "bundle.pem", "path": "ca.crt"}]}} \
        in pod["spec"]["volumes"]
    assert {"name": "kafka-ca", "mountPath": "/etc/spark-app/kafka-ca", "readOnly": True} \
        in pod["spec"]["containers"][0]["volumeMounts"]
    assert "kafka-hunter2" not in repr(connection)


def test_without_spec_kafka_a_driver_gets_no_kafka_connection() -> None:
    assert contract.DriverEnvironment.from_env(container_env(driver_pod(spec()))).kafka is None


def test_a_filesystem_driver_reads_the_config_the_operator_meant() -> None:
    s = spec()
    config = Config.from_env(container_env(driver_pod(s, epoch=3, root="pvc://state/team/wc/resets/r1")))
    backend = Backend.filesystem("/var/lib/spark-app/state/team/wc/resets/r1")
    assert config == Config(metadata_storage=backend, snapshot_storage=backend, snapshot_interval_ms=10_000,
                            epoch=3, pipeline="team/wc",
                            spark_conf={**podsecurity.scratch_spark_conf(), "spark.master": "local[2]"})


def test_an_s3_driver_reads_the_config_the_operator_meant_and_gets_credentials_only_from_the_secret() -> None:
    s = spec(S3_SPEC)
    env = container_env(driver_pod(s, epoch=9))
    backend = Backend.s3("s3://pipelines/team/wc", endpoint_url="http://127.0.0.1:9000", region="eu-west-1",
                         path_style=True)
    assert Config.from_env(env) == Config(
        metadata_storage=backend, snapshot_storage=backend, snapshot_interval_ms=5000, epoch=9, pipeline="team/wc",
        spark_conf={**podsecurity.scratch_spark_conf(), "spark.master": "local[2]",
                    "spark.sql.shuffle.partitions": "4"})
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("AKIAEXAMPLE", "hunter2")
    assert "hunter2" not in json.dumps(driver_pod(s)) and "AKIAEXAMPLE" not in json.dumps(driver_pod(s))


def test_a_kubernetes_mode_driver_reads_where_it_is_and_where_its_executors_go() -> None:
    s = spec(execution={"mode": "Kubernetes", "executors": {"instances": 3, "cores": 2, "memory": "4g"}},
             driver={"serviceAccountName": "runner"},
             application={"file": "p.py", "sparkConf": {"spark.master": "local[8]", "spark.ui.enabled": "false"}})
    conf = Config.from_env(container_env(driver_pod(s, epoch=5))).spark_conf
    assert conf["spark.master"] == "k8s://https://10.96.0.1:443"
    assert conf["spark.driver.host"] == "10.1.2.3" and conf["spark.submit.deployMode"] == "client"
    assert conf["spark.kubernetes.driver.pod.name"] == "wc-driver" and conf["spark.kubernetes.namespace"] == NAMESPACE
    assert conf["spark.kubernetes.container.image"] == s.image
    assert (conf["spark.executor.instances"], conf["spark.executor.cores"], conf["spark.executor.memory"]) == (
        "3", "2", "4g")
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == "runner"
    assert conf["spark.kubernetes.executor.label.sparkapp.dev/pipeline"] == NAME
    assert conf["spark.ui.enabled"] == "false"
    claim = "spark.kubernetes.executor.volumes.persistentVolumeClaim.state"
    assert conf[f"{claim}.options.claimName"] == "state" and conf[f"{claim}.mount.path"] == "/var/lib/spark-app/state"
    ports = driver_pod(s)["spec"]["containers"][0]["ports"]
    assert [p["containerPort"] for p in ports] == [7078, 7079]


def test_the_env_sets_every_contract_variable_it_needs_once() -> None:
    env = driver_pod(spec(S3_SPEC))["spec"]["containers"][0]["env"]
    names_in_order = [v["name"] for v in env]
    assert len(names_in_order) == len(set(names_in_order))
    for required in (contract.METADATA_URI, contract.SNAPSHOT_URI, contract.EPOCH, contract.PIPELINE,
                     contract.SNAPSHOT_INTERVAL_MS, contract.SPARK_CONF, contract.POD_NAME, contract.POD_NAMESPACE):
        assert required in names_in_order
    assert names_in_order.index(names.POD_IP_ENV) < names_in_order.index(contract.SPARK_CONF)


# ---- the driver pod ---------------------------------------------------------------------------


def test_the_driver_pod_is_named_labelled_annotated_and_owned() -> None:
    s = spec(restartNonce="n1")
    pod = driver_pod(s, epoch=4, root="pvc://state/team/wc")
    meta = pod["metadata"]
    assert (meta["name"], meta["namespace"]) == ("wc-driver", NAMESPACE) and meta["ownerReferences"] == [OWNER]
    assert meta["labels"][names.LABEL_PIPELINE] == NAME and meta["labels"][names.LABEL_ROLE] == "driver"
    assert meta["annotations"] == {names.ANNOTATION_EPOCH: "4", names.ANNOTATION_SPEC_HASH: s.pod_hash,
                                   names.ANNOTATION_RESTART_NONCE: "n1",
                                   names.ANNOTATION_STATE_ROOT: "pvc://state/team/wc",
                                   contract.LIVE_SETTINGS_ANNOTATION: '{"backfill":{}}'}
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["terminationGracePeriodSeconds"] == 30
    container = pod["spec"]["containers"][0]
    assert container["args"] == ["driver", "examples/wordcount.py", "--input", "/data/in", "--output", "/data/out.jsonl"]
    assert container["terminationMessagePath"] == contract.TERMINATION_LOG
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert pod["spec"]["volumes"][:-1] == [*podsecurity.scratch_volumes(),
                                           {"name": "state", "persistentVolumeClaim": {"claimName": "state"}}]
    assert container["volumeMounts"][:-1] == [*podsecurity.scratch_mounts(),
                                              {"name": "state", "mountPath": "/var/lib/spark-app/state"}]
    assert pod["spec"]["volumes"][-1]["name"] == container["volumeMounts"][-1]["name"] == "live-settings"
    assert "ports" not in container


def test_a_module_pipeline_runs_with_dash_m() -> None:
    assert driver_pod(spec(S3_SPEC))["spec"]["containers"][0]["args"] == ["driver", "-m", "pipelines.ads"]


def test_an_s3_driver_mounts_no_claim() -> None:
    pod = driver_pod(spec(S3_SPEC))
    assert pod["spec"]["volumes"][:-1] == podsecurity.scratch_volumes()  # and the live settings
    assert pod["spec"]["containers"][0]["volumeMounts"][:-1] == podsecurity.scratch_mounts()


def test_the_pod_template_adds_to_the_pod_and_the_operators_fields_win() -> None:
    template = {
        "metadata": {"labels": {"team": "ads", names.LABEL_PIPELINE: "spoofed"}, "annotations": {"a": "b"}},
        "spec": {
            "restartPolicy": "Always", "nodeSelector": {"pool": "spark"},
            "tolerations": [{"key": "spark", "operator": "Exists"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "containers": [{"name": "driver", "command": ["sh", "-c", "exec sleep 1000"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            "env": [{"name": "EXTRA", "value": "1"}]},
                           {"name": "sidecar", "image": "busybox"}],
        },
    }
    pod = driver_pod(spec(driver={"podTemplate": template, "env": [{"name": "TZ", "value": "UTC"}]}))
    assert pod["metadata"]["labels"]["team"] == "ads" and pod["metadata"]["labels"][names.LABEL_PIPELINE] == NAME
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["nodeSelector"] == {"pool": "spark"}
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["tmp", "spark-local", "cache", "data", "state",
                                                           "live-settings"]
    driver, sidecar = pod["spec"]["containers"]
    assert (driver["name"], sidecar["name"]) == ("driver", "sidecar")
    assert driver["command"] == ["sh", "-c", "exec sleep 1000"] and driver["image"] == spec().image
    assert [m["mountPath"] for m in driver["volumeMounts"]][-3:] == ["/data", "/var/lib/spark-app/state",
                                                                       "/etc/spark-app/live"]
    env = [v["name"] for v in driver["env"]]
    assert env[0] == "EXTRA" and "TZ" in env and contract.EPOCH in env


def test_merge_does_not_change_its_inputs() -> None:
    base = {"spec": {"volumes": [{"name": "a"}]}}
    builders.merge(base, {"spec": {"volumes": [{"name": "b"}]}})
    assert base == {"spec": {"volumes": [{"name": "a"}]}}


# ---- the Service and the cleanup pod ---------------------------------------------------------------


def test_the_driver_service_is_headless_and_selects_the_driver() -> None:
    service = builders.driver_service(spec(), owner=OWNER)
    assert service["metadata"]["name"] == "wc-driver" and service["metadata"]["ownerReferences"] == [OWNER]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {names.LABEL_PIPELINE: NAME, names.LABEL_ROLE: "driver"}


@pytest.mark.parametrize(("base", "uri"), [(None, "/var/lib/spark-app/state/team/wc"), (S3_SPEC, "s3://pipelines/team/wc")])
def test_the_cleanup_pod_resets_the_whole_base_with_the_runtimes_own_command(base: dict[str, Any] | None,
                                                                              uri: str) -> None:
    s = spec(base) if base else spec()
    pod = builders.cleanup_pod(s, owner=OWNER)
    container = pod["spec"]["containers"][0]
    assert pod["metadata"]["name"] == "wc-cleanup" and pod["spec"]["restartPolicy"] == "OnFailure"
    assert container["args"] == ["python", "-m", "spark_app", "reset", uri, "--yes"]
    assert pod["metadata"]["labels"][names.LABEL_ROLE] == names.ROLE_CLEANUP
    if base:
        env = {v["name"]: v for v in container["env"]}
        assert env[contract.S3_ENDPOINT]["value"] == "http://127.0.0.1:9000"
        assert "secretKeyRef" in env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]
    else:
        assert container["volumeMounts"] == [*podsecurity.scratch_mounts(),
                                             {"name": "state", "mountPath": "/var/lib/spark-app/state"}]


def test_owner_reference_points_at_the_pipeline_as_controller() -> None:
    resource = {"metadata": {"name": NAME, "uid": "uid-ppl"}}
    assert builders.owner_reference(resource) == OWNER


def test_path_style_off_reaches_the_driver_its_sources_and_the_cleanup_pod() -> None:
    """An S3-compatible server that wants virtual-hosted addressing: the state, the
    pipeline's own S3 paths and `spark_app reset` all address it alike."""
    from spark_app.contract import DriverEnvironment

    s = spec(S3_SPEC, persistence__s3__pathStyle=False)
    env = container_env(builders.driver_pod(s, epoch=1, state_root=s.persistence.base_uri, owner=OWNER))
    assert Config.from_env(env).metadata_storage.path_style is False
    assert DriverEnvironment.from_env(env).s3.path_style_addressing is False  # what the sources and dead letters use
    cleanup = {e["name"]: e.get("value") for e in builders.cleanup_pod(s, owner=OWNER)["spec"]["containers"][0]["env"]}
    assert (cleanup[contract.S3_ENDPOINT], cleanup[contract.S3_PATH_STYLE]) == ("http://127.0.0.1:9000", "false")


def test_the_driver_reads_its_live_settings_from_a_file_the_kubelet_keeps_equal_to_an_annotation() -> None:
    s = spec(inputs=[{"persistentId": "accounts", "backfill": {"rowsPerSecond": 0}}])
    pod = driver_pod(s)
    annotation = pod["metadata"]["annotations"][contract.LIVE_SETTINGS_ANNOTATION]
    assert contract.LiveSettings.from_json(annotation).backfill_rates == {"accounts": 0}
    volume = next(v for v in pod["spec"]["volumes"] if "downwardAPI" in v)
    [item] = volume["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{contract.LIVE_SETTINGS_ANNOTATION}']"
    container = pod["spec"]["containers"][0]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[contract.LIVE_SETTINGS_FILE] == f"{mount['mountPath']}/{item['path']}" and mount["readOnly"]
