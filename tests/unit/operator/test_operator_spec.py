"""parse_spec: defaults, and every semantic problem named with its field and reason."""

from __future__ import annotations

import pytest
from pipeline_operator.errors import InvalidSpec
from pipeline_operator.spec import (
    FilesystemBackend,
    Prerequisite,
    S3Backend,
    S3Credentials,
    parse_spec,
    prerequisites,
    uri_in_pod,
)
from ppl_factories import DELETE, NAMESPACE, S3_SPEC, raw, spec

from spark_app import contract


def problems(**changes: object) -> list[str]:
    with pytest.raises(InvalidSpec) as invalid:
        spec(**changes)
    return [str(p) for p in invalid.value.problems]


def test_a_minimal_filesystem_spec_gets_the_documented_defaults() -> None:
    s = spec()
    assert s.image == "ghcr.io/persistent-pipelines/spark-app:0.1.0" and s.image_pull_policy == "IfNotPresent"
    assert s.state == "running" and s.upgrade_mode == "last-state" and s.restart_nonce == ""
    assert s.persistence.backend == FilesystemBackend(claim_name="state", path="team/wc")
    assert (s.persistence.snapshot_interval_seconds, s.persistence.degraded_after_seconds) == (10, 50)
    assert s.persistence.on_delete == "Retain" and s.persistence.base_uri == "pvc://state/team/wc"
    assert s.restart_policy.type == "Always" and s.restart_policy.max_failures == 10
    assert (s.restart_policy.backoff.initial_seconds, s.restart_policy.backoff.max_seconds) == (10, 300)
    assert s.execution.mode == "Local" and s.execution.local_threads == 2
    assert s.driver.termination_grace_period_seconds == 30 and s.pipeline == "team/wc"


def test_an_s3_spec_defaults_its_prefix_path_style_and_credential_keys() -> None:
    s = spec(S3_SPEC)
    assert s.persistence.backend == S3Backend(
        bucket="pipelines", prefix="team/wc",
        options=contract.S3Options(endpoint="http://127.0.0.1:9000", region="eu-west-1"),
        credentials=S3Credentials(secret_name="s3-creds"))
    assert s.persistence.backend.options.path_style_addressing is True  # type: ignore[union-attr]
    assert s.persistence.base_uri == "s3://pipelines/team/wc" and s.application.module == "pipelines.ads"
    assert s.persistence.degraded_after_seconds == 25
    no_path_style = spec(S3_SPEC, persistence__s3__pathStyle=False).persistence.backend
    assert no_path_style.options.path_style_addressing is False  # type: ignore[union-attr]


def test_prerequisites_name_the_claim_the_secret_with_its_keys_and_the_service_account() -> None:
    assert prerequisites(spec(driver={"serviceAccountName": "runner"})) == [
        Prerequisite("PersistentVolumeClaim", "state", field="spec.persistence.filesystem.claimName"),
        Prerequisite("ServiceAccount", "runner", field="spec.driver.serviceAccountName"),
    ]
    s3 = spec(S3_SPEC, persistence__s3__credentialsSecret={"name": "c", "sessionTokenKey": "token"})
    assert prerequisites(s3) == [Prerequisite("Secret", "c", ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "token"),
                                              "spec.persistence.s3.credentialsSecret")]
    assert prerequisites(spec(S3_SPEC, persistence__s3__credentialsSecret=DELETE)) == []


def test_uri_in_pod_maps_a_claim_to_the_mount_and_leaves_s3_alone() -> None:
    assert uri_in_pod("pvc://state/team/wc/resets/r1") == "/var/lib/spark-app/state/team/wc/resets/r1"
    assert uri_in_pod("s3://b/team/wc") == "s3://b/team/wc"


@pytest.mark.parametrize(("changes", "expected"), [
    ({"persistence": DELETE}, "spec.persistence: is required"),
    ({"persistence": {"filesystem": {"claimName": "a"}, "s3": {"bucket": "b"}}},
     "spec.persistence: set exactly one backend"),
    ({"persistence": {"snapshotIntervalSeconds": 5}}, "spec.persistence: set exactly one backend"),
    ({"persistence": {"s3": {"bucket": ""}}}, "spec.persistence.s3.bucket: must not be empty"),
    ({"persistence__snapshotIntervalSeconds": 0}, "spec.persistence.snapshotIntervalSeconds: must be at least 1"),
    ({"persistence__snapshotIntervalSeconds": 10, "persistence__degradedAfterSeconds": 15},
     "spec.persistence.degradedAfterSeconds: must be at least 2 x snapshotIntervalSeconds (20)"),
    ({"persistence__filesystem__path": "../escape"}, "spec.persistence.filesystem.path: must be a relative path"),
    ({"persistence__filesystem__path": "/"}, "spec.persistence.filesystem.path: must not be empty"),
    ({"persistence__filesystem__claimName": ""}, "spec.persistence.filesystem.claimName: must not be empty"),
    ({"persistence__resetNonce": "Not OK"}, "spec.persistence.resetNonce: must be at most 63"),
    ({"persistence": {"s3": {"bucket": "b", "credentialsSecret": {}}}},
     "spec.persistence.s3.credentialsSecret.name: must not be empty"),
    ({"application__module": "m"}, "spec.application: set exactly one of file"),
    ({"application": {}}, "spec.application: set exactly one of file"),
    ({"application__sparkConf": {"spark.hadoop.fs.s3a.secret.key": "x"}},
     "spec.application.sparkConf.spark.hadoop.fs.s3a.secret.key: looks like a credential"),
    ({"application__sparkConf": {"spark.executor.cores": 2}}, "spec.application.sparkConf.spark.executor.cores: must be a string"),
    ({"application__args": "--input x"}, "spec.application.args: must be a list of strings"),
    ({"driver": {"env": [{"name": "SPARK_APP_EPOCH", "value": "9"}]}},
     "spec.driver.env[0].name: SPARK_APP_EPOCH is set by the operator"),
    ({"driver": {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "hunter2"}]}},
     "spec.driver.env[AWS_SECRET_ACCESS_KEY].value: AWS_SECRET_ACCESS_KEY must come from a Secret"),
    ({"driver": {"env": [{"value": "x"}]}}, "spec.driver.env: must be a list of environment variables"),
    ({"driver": {"terminationGracePeriodSeconds": 0}}, "spec.driver.terminationGracePeriodSeconds: must be at least 1"),
    ({"restartPolicy": {"type": "Sometimes"}}, "spec.restartPolicy.type: must be one of Always, OnFailure, Never"),
    ({"restartPolicy": {"backoff": {"initialSeconds": 60, "maxSeconds": 30}}},
     "spec.restartPolicy.backoff.maxSeconds: must be at least initialSeconds (60)"),
    ({"restartPolicy": {"backoff": {"jitter": 1.5}}}, "spec.restartPolicy.backoff.jitter: must be between 0 and 1"),
    ({"restartPolicy": {"maxFailures": 2.5}}, "spec.restartPolicy.maxFailures: must be an integer"),
    ({"state": "paused"}, "spec.state: must be one of running, suspended"),
    ({"upgradeMode": "savepoint"}, "spec.upgradeMode: must be one of last-state, stateless"),
    ({"execution": {"mode": "Yarn"}}, "spec.execution.mode: must be one of Local, Kubernetes"),
    ({"execution": {"executors": {"instances": 0}}}, "spec.execution.executors.instances: must be at least 1"),
    ({"image": ""}, "spec.image: must not be empty"),
    ({"kafka": {"bootstrapServers": "kafka"}}, "spec.kafka.bootstrapServers: must be host:port[,host:port...]"),
    ({"kafka": {"bootstrapServers": "kafka:9092", "securityProtocol": "SASL_SSL"}},
     "spec.kafka.sasl: is needed with securityProtocol SASL_SSL"),
    ({"kafka": {"bootstrapServers": "kafka:9092", "sasl": {"credentialsSecret": {"name": "k"}}}},
     "spec.kafka.sasl: needs securityProtocol SASL_PLAINTEXT or SASL_SSL (got PLAINTEXT)"),
    ({"kafka": {"bootstrapServers": "kafka:9092", "securityProtocol": "SASL_PLAINTEXT",
                "sasl": {"mechanism": "GSSAPI", "credentialsSecret": {"name": "k"}}}},
     "spec.kafka.sasl.mechanism: must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    ({"kafka": {"bootstrapServers": "kafka:9092", "tls": {"caSecret": {"name": "ca"}}}},
     "spec.kafka.tls: needs securityProtocol SSL or SASL_SSL (got PLAINTEXT)"),
    ({"kafka": {"bootstrapServers": "kafka:9092", "securityProtocol": "SSL", "tls": {}}},
     "spec.kafka.tls: set exactly one of caSecret and caConfigMap"),
])
def test_each_problem_names_its_field_and_reason(changes: dict[str, object], expected: str) -> None:
    found = problems(**changes)
    assert any(p.startswith(expected) for p in found), found


def test_all_problems_are_reported_together() -> None:
    found = problems(state="paused", persistence__snapshotIntervalSeconds=0, image="")
    assert len(found) == 3


def test_a_name_too_long_for_the_driver_pod_is_a_problem() -> None:
    with pytest.raises(InvalidSpec, match="metadata.name: must be at most 56 characters"):
        parse_spec(raw(), namespace=NAMESPACE, name="x" * 57)


def test_credentials_from_a_secret_are_fine_in_env() -> None:
    env = [{"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    assert spec(driver={"env": env}).driver.env == tuple(env)


@pytest.mark.parametrize("changes", [
    {"image": "other:1"}, {"application__args": ["--input", "/elsewhere"]},
    {"application__sparkConf": {"spark.sql.shuffle.partitions": "8"}}, {"driver": {"resources": {"limits": {"cpu": 2}}}},
    {"execution": {"mode": "Kubernetes"}}, {"persistence__snapshotIntervalSeconds": 30},
    {"persistence__filesystem__claimName": "other"}, {"driver": {"podTemplate": {"spec": {"nodeSelector": {"a": "b"}}}}},
])
def test_the_pod_hash_changes_with_what_shapes_the_pod(changes: dict[str, object]) -> None:
    assert spec(**changes).pod_hash != spec().pod_hash


@pytest.mark.parametrize("changes", [
    {"state": "suspended"}, {"restartNonce": "n"}, {"restartPolicy": {"maxFailures": 1}},
    {"persistence__degradedAfterSeconds": 100}, {"persistence__onDelete": "Delete"},
    {"driver": {"stuckAfterSeconds": 5}}, {"upgradeMode": "stateless"},
    {"inputs": [{"persistentId": "accounts", "backfill": {"rowsPerSecond": 0}}]},
])
def test_the_pod_hash_ignores_what_does_not(changes: dict[str, object]) -> None:
    assert spec(**changes).pod_hash == spec().pod_hash


def test_source_bounds_and_the_outage_budget_reach_the_driver() -> None:
    from pipeline_operator.builders import injected_config
    from ppl_factories import spec as make

    s = make(application={"file": "p.py", "sourceDefaults": {"maxFilesPerTrigger": 50, "maxBytesPerTrigger": "64Mi"}},
             persistence={"filesystem": {"claimName": "state"}, "outageBudgetSeconds": 120})
    env = injected_config(s, epoch=1, state_root="pvc://state/team/wc").to_env()
    assert (env["SPARK_APP_MAX_FILES_PER_TRIGGER"], env["SPARK_APP_MAX_BYTES_PER_TRIGGER"]) == ("50", str(64 << 20))
    assert env["SPARK_APP_OUTAGE_BUDGET_SECONDS"] == "120"
    plain = injected_config(make(), epoch=1, state_root="pvc://state/team/wc").to_env()
    assert "SPARK_APP_MAX_FILES_PER_TRIGGER" not in plain and plain["SPARK_APP_OUTAGE_BUDGET_SECONDS"] == "900"


def test_a_byte_bound_that_is_not_a_quantity_is_refused_with_its_field() -> None:
    from pipeline_operator.errors import InvalidSpec
    from pipeline_operator.spec import parse_spec

    with pytest.raises(InvalidSpec, match=r"spec.application.sourceDefaults.maxBytesPerTrigger: must be a positive"):
        parse_spec({"application": {"file": "p.py", "sourceDefaults": {"maxBytesPerTrigger": "lots"}},
                    "persistence": {"filesystem": {"claimName": "state"}}}, namespace="n", name="p")


def test_inputs_give_the_driver_its_live_backfill_rates() -> None:
    s = spec(inputs=[{"persistentId": "accounts", "backfill": {"rowsPerSecond": 1000}},
                     {"persistentId": "users", "backfill": {"rowsPerSecond": None}},
                     {"persistentId": "events", "backfill": {}}, {"persistentId": "clicks"}])
    assert s.live_settings.backfill_rates == {"accounts": 1000, "users": None, "events": None}
    assert spec().live_settings.to_json() == '{"backfill":{}}'


@pytest.mark.parametrize(("inputs", "field", "reason"), [
    ([{"persistentId": "a b"}], "spec.inputs[0].persistentId", "may use only letters"),
    ([{"persistentId": "a"}, {"persistentId": "a"}], "spec.inputs[1].persistentId", "listed twice"),
    ([{"persistentId": "a", "backfill": {"rowsPerSecond": -1}}], "spec.inputs[0].backfill.rowsPerSecond",
     "at least 0"),
    ([{"persistentId": "a", "backfill": {"rowsPerSecond": "fast"}}], "spec.inputs[0].backfill.rowsPerSecond",
     "must be an integer"),
    ([{"backfill": {}}], "spec.inputs[0].persistentId", "must not be empty"),
    ({"persistentId": "a"}, "spec.inputs", "must be a list"),
])
def test_a_bad_input_is_refused_with_its_field(inputs: object, field: str, reason: str) -> None:
    from pipeline_operator.errors import InvalidSpec

    with pytest.raises(InvalidSpec) as refused:
        spec(inputs=inputs)
    assert any(p.field == field and reason in p.reason for p in refused.value.problems), refused.value.problems


KAFKA = {"bootstrapServers": "kafka-0.kafka:9093,kafka-1.kafka:9093", "securityProtocol": "SASL_SSL",
         "sasl": {"mechanism": "SCRAM-SHA-512", "credentialsSecret": {"name": "kafka-user"}},
         "tls": {"caConfigMap": {"name": "kafka-ca"}}}


def test_a_kafka_connection_defaults_its_keys_and_needs_its_credentials_secret() -> None:
    s = spec(kafka=KAFKA)
    assert s.kafka is not None and s.kafka.credentials is not None and s.kafka.ca is not None
    assert (s.kafka.credentials.username_key, s.kafka.credentials.password_key) == ("username", "password")
    assert (s.kafka.ca.kind, s.kafka.ca.name, s.kafka.ca.key) == ("ConfigMap", "kafka-ca", "ca.crt")
    assert Prerequisite("Secret", "kafka-user", ("username", "password"), "spec.kafka.sasl.credentialsSecret") \
        in prerequisites(s)
    assert s.pod_hash != spec().pod_hash


def test_a_release_that_learns_a_new_optional_setting_keeps_the_pod_hash_of_pipelines_without_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed pod hash restarts the running driver: installing an operator whose spec
    dataclasses gained a field (unset, None, for every existing pipeline) must not restart
    every pipeline of the cluster."""
    from dataclasses import asdict

    import pipeline_operator.spec as spec_module

    before = spec(raw()).pod_hash

    def with_a_new_setting(value):  # type: ignore[no-untyped-def]
        return {**asdict(value), "a_setting_of_the_next_release": None}

    monkeypatch.setattr(spec_module, "asdict", with_a_new_setting)
    assert spec(raw()).pod_hash == before
