"""The apache/kafka image's stand-in reads the image's variables as the image does, and runs
the broker the way Kafka's scripts do."""

import uuid
from pathlib import Path

import pytest

from localcluster.kafka import (
    DEFAULT_CLUSTER_ID,
    DEFAULT_HEAP_OPTS,
    IMAGE_DEFAULTS,
    BrokerConfigError,
    NodeSettings,
    config_from_env,
    format_argv,
    log4j_config,
    new_cluster_id,
    property_name,
    server_argv,
    server_properties,
)


@pytest.mark.parametrize(
    ("variable", "name"),
    [
        ("KAFKA_LOG_DIRS", "log.dirs"),
        ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "transaction.state.log.min.isr"),
        ("KAFKA_LISTENER_NAME_INTERNAL_SSL__CLIENT__AUTH", "listener.name.internal.ssl_client_auth"),
        ("KAFKA_SASL_MECHANISM___X", "sasl.mechanism-x"),
    ],
)
def test_a_variable_names_the_property_by_the_images_rule(variable: str, name: str) -> None:
    assert property_name(variable) == name


def test_without_kafka_variables_the_images_single_node_defaults_apply() -> None:
    config = config_from_env({"PATH": "/bin", "KAFKA_HEAP_OPTS": "-Xmx256M"})
    assert dict(config.properties) == IMAGE_DEFAULTS
    assert config.cluster_id == DEFAULT_CLUSTER_ID
    assert config.heap_opts == "-Xmx256M"


def test_the_jvms_variables_are_not_broker_properties() -> None:
    env = {"KAFKA_NODE_ID": "3", "KAFKA_OPTS": "-Dx=1", "KAFKA_LOG4J_ROOT_LOGLEVEL": "WARN",
           "KAFKA_JVM_PERFORMANCE_OPTS": "-server", "CLUSTER_ID": "abc"}  # fmt: skip
    config = config_from_env(env)
    assert dict(config.properties) == {"node.id": "3"}
    assert (config.opts, config.root_log_level, config.jvm_performance_opts) == ("-Dx=1", "WARN", "-server")
    assert config.cluster_id == "abc" and config.heap_opts == DEFAULT_HEAP_OPTS


def test_listeners_default_to_the_advertised_ones_on_every_interface() -> None:
    env = {"KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://kafka.ns.svc:9092,INTERNAL://localhost:9094"}
    assert config_from_env(env).property("listeners") == "PLAINTEXT://0.0.0.0:9092,INTERNAL://0.0.0.0:9094"


def test_the_bind_host_replaces_only_the_wildcard_hosts_of_the_listeners() -> None:
    env = {
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,INTERNAL://localhost:9094,CONTROLLER://0.0.0.0:9093,V6://[::]:9095",
        "KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://kafka.ns.svc:9092",
    }
    config = config_from_env(env, bind_host="127.0.0.1")
    assert config.property("listeners") == (
        "PLAINTEXT://127.0.0.1:9092,INTERNAL://localhost:9094,CONTROLLER://127.0.0.1:9093,V6://127.0.0.1:9095"
    )
    assert config.property("advertised.listeners") == "PLAINTEXT://kafka.ns.svc:9092"


def test_a_controller_only_node_refuses_advertised_listeners_as_the_image_does() -> None:
    env = {"KAFKA_PROCESS_ROLES": "controller", "KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://x:9092"}
    with pytest.raises(BrokerConfigError, match="not supported on a KRaft controller"):
        config_from_env(env)


def test_a_single_node_runs_transactions_on_its_own() -> None:
    env = NodeSettings(log_dir="/data/kafka", port=19092, controller_port=19093).image_env()
    properties = dict(config_from_env(env).properties)
    assert properties["process.roles"] == "broker,controller"
    assert properties["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert properties["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert properties["log.dirs"] == "/data/kafka"
    for name in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                 "transaction.state.log.min.isr"):  # fmt: skip
        assert properties[name] == "1"


def test_server_properties_escape_what_java_would_read_as_an_escape() -> None:
    config = config_from_env({"KAFKA_SSL_KEYSTORE_LOCATION": "C:\\keys", "KAFKA_NODE_ID": "1"})
    assert server_properties(config) == "node.id=1\nssl.keystore.location=C:\\\\keys\n"


def test_loggers_and_the_root_level_go_into_the_log4j_configuration() -> None:
    config = config_from_env({"KAFKA_LOG4J_LOGGERS": "kafka.controller=WARN, state.change.logger=ERROR"})
    text = log4j_config(config.root_log_level, config.loggers)
    assert "rootLogger.level = INFO" in text
    assert "logger.l0.name = kafka.controller\nlogger.l0.level = WARN" in text
    assert "logger.l1.name = state.change.logger\nlogger.l1.level = ERROR" in text
    with pytest.raises(BrokerConfigError):
        config_from_env({"KAFKA_LOG4J_LOGGERS": "kafka.controller"})


def test_the_storage_is_formatted_once_and_the_server_runs_with_the_users_options() -> None:
    config = config_from_env({"KAFKA_NODE_ID": "1", "KAFKA_OPTS": "-Dmine=1", "CLUSTER_ID": "c1"})
    jars, conf = Path("/jars"), Path("/conf")
    storage = format_argv("java", jars, conf, config)
    assert storage[storage.index("kafka.tools.StorageTool"):] == [
        "kafka.tools.StorageTool", "format", "--cluster-id", "c1",
        "--config", "/conf/server.properties", "--ignore-formatted",
    ]  # fmt: skip
    server = server_argv("java", jars, conf, config)
    assert server[:3] == ["java", "-Xmx1G", "-Xms1G"]
    assert "-Dmine=1" in server and "-Dlog4j2.configurationFile=/conf/log4j2.properties" in server
    assert server[-4:] == ["-cp", "/jars/*", "kafka.Kafka", "/conf/server.properties"]


def test_a_new_cluster_id_never_starts_with_a_dash_which_the_storage_tool_reads_as_an_option() -> None:
    # 0xf8 makes the first base64 digit 62, '-': one draw in 64 (CI's broker once failed to format).
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x10" * 16)])
    cluster_id = new_cluster_id(lambda: next(draws))
    assert cluster_id == "EBAQEBAQEBAQEBAQEBAQEA"
    assert len(new_cluster_id()) == 22
