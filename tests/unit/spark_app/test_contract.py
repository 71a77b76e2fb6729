"""The operator ↔ driver contract: what one side writes, the other reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_app import contract
from spark_app.contract import (
    EXECUTOR_CONTAINER,
    EXECUTOR_POD_TEMPLATE,
    REDACTED,
    ContractError,
    InjectedConfig,
    executor_pod_template_conf,
    scrub_credentials,
)
from spark_app.persistence import Backend, Config


def test_injected_env_round_trips_into_a_persistence_config() -> None:
    injected = InjectedConfig(
        metadata_uri="s3://bucket/ns/name", snapshot_uri="s3://bucket/ns/name", snapshot_interval_ms=5000,
        epoch=7, pipeline="ns/name", s3=contract.S3Options("http://127.0.0.1:9000", "eu-west-1", True),
        spark_conf={"spark.master": "local[2]"},
    )
    config = Config.from_env(injected.to_env())
    assert config.metadata_storage == Backend.s3("s3://bucket/ns/name", endpoint_url="http://127.0.0.1:9000",
                                                 region="eu-west-1", path_style=True)
    assert (config.snapshot_interval_ms, config.epoch, config.pipeline) == (5000, 7, "ns/name")
    assert config.spark_conf == {"spark.master": "local[2]"}
    assert not any("SECRET" in key for key in injected.to_env())


def test_filesystem_roots_and_defaults() -> None:
    config = Config.from_env({"SPARK_APP_METADATA_URI": "/var/lib/spark-app/state/ns/p"})
    assert config.metadata_storage == config.snapshot_storage == Backend.filesystem("/var/lib/spark-app/state/ns/p")
    assert config.epoch is None


@pytest.mark.parametrize(("env", "message"), [
    ({}, "SPARK_APP_METADATA_URI is not set"),
    ({"SPARK_APP_METADATA_URI": "/s", "SPARK_APP_SNAPSHOT_INTERVAL_MS": "0"}, "must be positive"),
    ({"SPARK_APP_METADATA_URI": "/s", "SPARK_APP_EPOCH": "x"}, "is not an integer"),
    ({"SPARK_APP_METADATA_URI": "/s", "SPARK_APP_SPARK_CONF": "[1]"}, "must be a JSON object"),
])
def test_malformed_injection_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ContractError, match=message):
        Config.from_env(env)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("snapshot_interval_ms", 0, "snapshot_interval_ms must be positive"),
    ("outage_budget_s", -1.0, "outage_budget_s must be positive"),
    ("lease_ttl_s", 0.5, "lease_ttl_s must be at least 1 second"),
])
def test_a_config_out_of_range_names_its_field(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Config.simple_config(Backend.filesystem("/s"), **{field: value})


@pytest.mark.parametrize(("env", "addressing"), [
    ({}, False),
    ({contract.S3_ENDPOINT: "http://127.0.0.1:9000"}, True),
    ({contract.S3_ENDPOINT: "http://127.0.0.1:9000", contract.S3_PATH_STYLE: "false"}, False),
    ({contract.S3_PATH_STYLE: "true"}, True),
])
def test_s3_options_keep_an_explicit_path_style_and_default_it_from_the_endpoint(
        env: dict[str, str], addressing: bool) -> None:
    options = contract.S3Options.from_env(env)
    assert options.path_style_addressing is addressing
    assert contract.S3Options.from_env(options.to_env()).path_style_addressing is addressing


def test_a_path_style_that_is_not_a_boolean_is_refused_with_its_name() -> None:
    with pytest.raises(ContractError, match="SPARK_APP_S3_PATH_STYLE='maybe' must be true or false"):
        contract.S3Options.from_env({contract.S3_PATH_STYLE: "maybe"})


def test_a_local_run_has_no_injected_config_but_keeps_its_epoch_and_spark_settings() -> None:
    environment = contract.DriverEnvironment.from_env({contract.EPOCH: "3", contract.SPARK_CONF: '{"a": "b"}'})
    assert environment.injected is None and environment.epoch == 3 and environment.spark_conf == {"a": "b"}
    assert environment.termination_log == contract.TERMINATION_LOG


def test_a_termination_message_is_cut_to_what_kubernetes_keeps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "termination-log"
    contract.write_termination_message("é" * 5000, str(path))
    assert len(path.read_bytes()) <= contract.TERMINATION_MESSAGE_LIMIT and path.read_text().startswith("éé")


def test_the_drivers_report_reads_back_as_the_operator_reads_it() -> None:
    sent = contract.DriverReport(epoch=3, stored_epoch=2, state="running", reported_at=1_800_000_000.25, queries={
        "counts": contract.QueryReport(batch=7, batch_time_ms=11, commit_time_ms=1_800_000_000_000,
                                       offsets={"words": {"source": "words", "files": 9}}, backlog=True,
                                       malformed=2, file_problems=1, iterate={"decision": "warm"},
                                       input_rows_per_s=12.5, lag={"clicks": {"raw": {"0": 4, "1": 0}}})})
    assert contract.DriverReport.from_json(sent.to_json()) == sent
    assert contract.DriverReport.from_json(contract.DriverReport(epoch=3, stored_epoch=2, state="running").to_json()) \
        is None  # never sent: not stamped
# ---- the executors' pod template -------------------------------------------------------------


def test_the_injected_executor_pod_template_becomes_a_file_that_spark_is_told_about(tmp_path: Path) -> None:
    template = {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": "executor"}]}}
    conf = executor_pod_template_conf({EXECUTOR_POD_TEMPLATE: json.dumps(template)}, str(tmp_path))
    assert conf["spark.kubernetes.executor.podTemplateContainerName"] == EXECUTOR_CONTAINER
    written = Path(conf["spark.kubernetes.executor.podTemplateFile"])
    assert written.parent == tmp_path and json.loads(written.read_text()) == template
    assert executor_pod_template_conf({}, str(tmp_path)) == {}, "local execution: no template"


@pytest.mark.parametrize(("raw", "message"), [("{", "is not valid JSON"), ('{"kind": "Service"}', "JSON of a Pod")])
def test_a_malformed_executor_pod_template_is_named(raw: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=f"{EXECUTOR_POD_TEMPLATE} .*{message}"):
        executor_pod_template_conf({EXECUTOR_POD_TEMPLATE: raw}, str(tmp_path))


# ---- credentials never leave a pod as words ------------------------------------------------------

# Fake credentials of every kind the scrubber knows, in the contexts they show up in.
LEAKS = [
    ("key id AKIAIOSFODNN7EXAMPLE in a message", "AKIAIOSFODNN7EXAMPLE"),
    ("temporary ASIAXYZXYZXYZXYZXYZ1 too", "ASIAXYZXYZXYZXYZXYZ1"),
    ("the secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY alone", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("AWS_SECRET_ACCESS_KEY=abc123def456", "abc123def456"),
    ('{"password": "hunter2", "user": "app"}', "hunter2"),
    ("connect postgres://app:hunter2@db:5432/orders failed", "hunter2"),
    ("Authorization: Bearer abc.DEF-ghi_123=", "abc.DEF-ghi_123"),
    ("token eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLXZhbHVl used", "eyJzdWIiOiJzeXN0ZW0ifQ"),
    ("db.password: 'p@ss w0rd'", "p@ss"),
    ("api_key=sk_live_123;", "sk_live_123"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow"),
    ('kafka.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="app" '
     'password="kafka secret";', "kafka secret"),
    ("sasl.jaas.config: PlainLoginModule required username=app password=p4ss; next", "p4ss"),
    ('sasl.password="two words" in librdkafka', "two words"),
    ("SPARK_APP_KAFKA_SASL_PASSWORD=hunter2", "hunter2"),
]


@pytest.mark.parametrize(("text", "secret"), LEAKS)
def test_credentials_are_scrubbed_and_the_rest_of_the_message_kept(text: str, secret: str) -> None:
    scrubbed = scrub_credentials(text)
    assert secret not in scrubbed and REDACTED in scrubbed
    assert scrubbed == scrub_credentials(scrubbed), "scrubbing twice changes nothing more"


@pytest.mark.parametrize("text", [
    "stale epoch; stored epoch is 12",
    "Fenced: epoch 3 was superseded at log entry 41",
    "commit 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39 and SHA 3F2A9C1D8E7B6A5F4E3D2C1B0A9F8E7D6C5B4A39",
    "FileNotFoundError: /data/inputs/a.csv (s3://bucket/prefix/log/00000000000000000041.json)",
])
def test_ordinary_messages_pass_unchanged(text: str) -> None:
    assert scrub_credentials(text) == text


# ---- the Kafka connection -------------------------------------------------------------------------


def test_a_kafka_connection_round_trips_without_its_credentials_in_the_injected_values() -> None:
    connection = contract.KafkaConnection("kafka:9093", "SASL_SSL", "SCRAM-SHA-512", "app", "hunter2", "/ca.pem")
    env = connection.to_env()
    assert "hunter2" not in json.dumps(env) and "app" not in env.values()
    secrets = {contract.KAFKA_SASL_USERNAME: "app", contract.KAFKA_SASL_PASSWORD: "hunter2"}
    assert contract.KafkaConnection.from_env({**env, **secrets}) == connection
    assert "hunter2" not in repr(connection)
    assert contract.KafkaConnection.from_env({}) is None


@pytest.mark.parametrize(("env", "message"), [
    ({contract.KAFKA_SECURITY_PROTOCOL: "TLS"}, "security protocol 'TLS' is not one of"),
    ({contract.KAFKA_SECURITY_PROTOCOL: "SASL_PLAINTEXT"}, "needs a SASL mechanism"),
    ({contract.KAFKA_SECURITY_PROTOCOL: "SASL_PLAINTEXT", contract.KAFKA_SASL_MECHANISM: "PLAIN"},
     "needs a username and a password"),
    ({contract.KAFKA_SASL_MECHANISM: "PLAIN"}, "needs security protocol SASL_PLAINTEXT or SASL_SSL"),
])
def test_a_kafka_connection_that_cannot_work_is_refused_with_what_to_set(env: dict[str, str], message: str) -> None:
    with pytest.raises(ContractError, match=message):
        contract.KafkaConnection.from_env({contract.KAFKA_BOOTSTRAP_SERVERS: "kafka:9092", **env})


# ---- live settings and backfills ------------------------------------------------------------------


def test_live_settings_round_trip_and_refuse_a_negative_rate() -> None:
    settings = contract.LiveSettings({"accounts": 250.0, "orders": None, "paused": 0.0})
    assert contract.LiveSettings.from_json(settings.to_json()) == settings
    assert contract.LiveSettings.from_json("") == contract.LiveSettings()
    with pytest.raises(ContractError, match=r"backfill.accounts.rowsPerSecond must be a number ≥ 0 or null, got -1"):
        contract.LiveSettings.from_json('{"backfill": {"accounts": {"rowsPerSecond": -1}}}')
    with pytest.raises(ContractError, match="not of the expected shape"):
        contract.LiveSettings.from_json('{"backfill": [1]}')


def test_a_backfill_report_survives_the_pod_annotation_and_describes_itself() -> None:
    running = contract.BackfillReport(rows_read=3_750_000, rows_total=10_000_000, percent=37.5,
                                      rows_per_second=41_200.0, eta_seconds=152.0, version=12)
    report = contract.DriverReport(epoch=2, stored_epoch=1, state="running", reported_at=1.0,
                                   backfills={"accounts": running})
    assert contract.DriverReport.from_json(report.to_json()) == report
    assert running.describe() == "37.5% 41.2k rows/s ETA 3m"
    assert contract.BackfillReport(10, 40, 25.0, paused=True).describe() == "paused at 25%"
    assert contract.BackfillReport(40, 40, 100.0, finished=True).describe() == "done"
    assert "backfills" not in contract.DriverReport(epoch=1, stored_epoch=0, state="running").to_json()
