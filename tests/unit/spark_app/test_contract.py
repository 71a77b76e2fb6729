"""The operator ↔ driver contract: what one side writes, the other reads."""

from __future__ import annotations

import pytest

from spark_app import contract
from spark_app.contract import ContractError, InjectedConfig
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
                                       input_rows_per_s=12.5)})
    assert contract.DriverReport.from_json(sent.to_json()) == sent
    assert contract.DriverReport.from_json(contract.DriverReport(epoch=3, stored_epoch=2, state="running").to_json()) \
        is None  # never sent: not stamped
