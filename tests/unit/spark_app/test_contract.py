"""The operator ↔ driver contract: what one side writes, the other reads."""

from __future__ import annotations

import pytest

from spark_app.contract import ContractError, InjectedConfig
from spark_app.persistence import Backend, Config


def test_injected_env_round_trips_into_a_persistence_config() -> None:
    injected = InjectedConfig(
        metadata_uri="s3://bucket/ns/name", snapshot_uri="s3://bucket/ns/name", snapshot_interval_ms=5000,
        epoch=7, pipeline="ns/name", s3_endpoint="http://127.0.0.1:9000", s3_region="eu-west-1",
        s3_path_style=True, spark_conf={"spark.master": "local[2]"},
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
