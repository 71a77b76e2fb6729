"""A pipeline reads a broker that asks for SASL credentials, given to the driver as the
operator gives them (SPARK_APP_KAFKA_*, the username and password from a Secret), in plain
text and over TLS (the CA as a mounted PEM file): the output is exact, and the password is
in none of the driver's arguments, log or termination message, whether it is right or wrong."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_app import contract
from tests.integration.spark_app.harness import Workspace, fold, read_changelog
from tests.integration.spark_app.test_kafka_source import produce_files
from tests.integration.spark_app.words import expected_counts
from tests.support.kafka import KafkaBroker, start_broker, stop_broker

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PASSWORD = "s3cr3t-Kafka-pa55"
WRONG = "wr0ng-Kafka-pa55"


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    process, broker = start_broker(tmp_path_factory.mktemp("kafka-sasl"), sasl_users={"pipeline": PASSWORD},
                                   tls=True)
    yield broker
    stop_broker(process)


def connection_env(broker: KafkaBroker, password: str) -> dict[str, str]:
    assert broker.sasl_bootstrap_servers is not None
    return {contract.KAFKA_BOOTSTRAP_SERVERS: broker.sasl_bootstrap_servers,
            contract.KAFKA_SECURITY_PROTOCOL: "SASL_PLAINTEXT", contract.KAFKA_SASL_MECHANISM: "PLAIN",
            contract.KAFKA_SASL_USERNAME: "pipeline", contract.KAFKA_SASL_PASSWORD: password}


def leaks(workspace_root: Path, secret: str) -> list[str]:
    return [p.name for p in workspace_root.glob("driver-*.log*") if secret in p.read_text(errors="replace")]


def test_sasl_credentials_from_the_environment_reach_kafka_and_nothing_else(
        sasl_broker: KafkaBroker, fs_workspace: Workspace) -> None:
    workspace = fs_workspace
    topic = sasl_broker.new_topic(partitions=2)
    produce_files(sasl_broker, topic, range(3), 2)  # over the PLAINTEXT listener
    driver = workspace.kafka_driver(None, topic, "--stop-when-idle",
                                    env=connection_env(sasl_broker, PASSWORD)).start()
    assert driver.wait() == 0, driver.output()[-3000:]
    assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(3))
    assert PASSWORD not in " ".join(driver.args)
    assert leaks(workspace.root, PASSWORD) == []

    refused = workspace.kafka_driver(None, topic, "--stop-when-idle", env=connection_env(sasl_broker, WRONG)).start()
    assert refused.wait(300) != 0, refused.output()[-3000:]
    assert "Authentication failed" in refused.output() or "SaslAuthenticationException" in refused.output()
    assert leaks(workspace.root, WRONG) == []


def test_sasl_over_tls_with_the_ca_from_a_file_reads_the_topic(sasl_broker: KafkaBroker, fs_workspace: Workspace) -> None:
    workspace = fs_workspace
    topic = sasl_broker.new_topic(partitions=2)
    produce_files(sasl_broker, topic, range(2), 2)
    assert sasl_broker.sasl_ssl_bootstrap_servers is not None and sasl_broker.ca_file is not None
    env = {**connection_env(sasl_broker, PASSWORD),
           contract.KAFKA_BOOTSTRAP_SERVERS: sasl_broker.sasl_ssl_bootstrap_servers,
           contract.KAFKA_SECURITY_PROTOCOL: "SASL_SSL", contract.KAFKA_CA_FILE: str(sasl_broker.ca_file)}
    driver = workspace.kafka_driver(None, topic, "--stop-when-idle", env=env).start()
    assert driver.wait() == 0, driver.output()[-3000:]
    assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(2))
    assert leaks(workspace.root, PASSWORD) == []
