"""A Kafka broker from the jars tools/kafka/pom.xml pins (`make kafka`, linked at .cache/kafka):
the local cluster's stand-in for the `apache/kafka` image, and the tests' broker.

    python -m localcluster.kafka [--jars DIR] [--config-dir DIR] [--bind-host HOST]

It reads the image's environment, as the image's own scripts do (docker/resources in Kafka's
source, and kafka.docker.KafkaDockerWrapper in the broker's jar):

- every `KAFKA_*` variable but the JVM's (KAFKA_HEAP_OPTS, KAFKA_OPTS, ...) is a property of
  server.properties: `KAFKA_` dropped, lower case, `_` -> `.`, `__` -> `_`, `___` -> `-`;
- with no such variable, the image's single-node defaults apply;
- KAFKA_LISTENERS defaults to KAFKA_ADVERTISED_LISTENERS with every host made 0.0.0.0, and a
  controller-only node refuses advertised listeners;
- CLUSTER_ID names the cluster (the image's fixed default when unset);
- KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS and KAFKA_OPTS are the JVM's options (the
  defaults of Kafka's start scripts when unset); KAFKA_LOG4J_ROOT_LOGLEVEL and
  KAFKA_LOG4J_LOGGERS ("logger=LEVEL,...") set the logging, which goes to stdout.

Then, as the image does at every start, it formats the storage (skipping log folders that
are already formatted) and becomes the broker's JVM (exec), so that a container's SIGTERM
reaches Kafka and its graceful shutdown.

Where it differs from the image, and why: `--bind-host` replaces the wildcard hosts of the
listeners (0.0.0.0, `::` or none) because a pod of the local cluster lives on the host's
loopback and servers here bind to 127.0.0.1 only; the image's file input
(/mnt/shared/config) and its SSL and SASL helpers are not supported.

`NodeSettings.image_env()` gives the variables of a single node, broker and controller, on
which transactions work (the tests' broker, tests/support/kafka.py, runs with them).
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JARS = REPO / ".cache" / "kafka"

# The image's default cluster id (docker/resources/common-scripts/configureDefaults).
DEFAULT_CLUSTER_ID = "5L6g3nShT-eMCtK--X86sw"


def new_cluster_id(draw: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    """A fresh cluster id in Kafka's form: a UUID's 16 bytes, URL-safe base64, unpadded.

    One id in 64 would start with '-', which the storage tool's argument parser reads as an
    option ("--cluster-id: expected one argument"); Kafka's own Uuid.randomUuid draws again
    in that case, and so does this.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(draw().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


# The image's server.properties when no KAFKA_ variable is set
# (docker/resources/common-scripts/server.properties).
IMAGE_DEFAULTS: Mapping[str, str] = {
    "advertised.listeners": "PLAINTEXT://localhost:29092,PLAINTEXT_HOST://localhost:9092",
    "controller.listener.names": "CONTROLLER",
    "controller.quorum.voters": "1@localhost:29093",
    "group.initial.rebalance.delay.ms": "0",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT",
    "listeners": "PLAINTEXT://localhost:29092,CONTROLLER://localhost:29093,PLAINTEXT_HOST://0.0.0.0:9092",
    "log.dirs": "/tmp/kraft-combined-logs",
    "node.id": "1",
    "offsets.topic.replication.factor": "1",
    "process.roles": "broker,controller",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.replication.factor": "1",
}

# KAFKA_ variables that are not broker properties (KafkaDockerWrapper's ExcludeServerPropsEnv).
NOT_PROPERTIES = frozenset({
    "KAFKA_VERSION", "KAFKA_HEAP_OPTS", "KAFKA_LOG4J_OPTS", "KAFKA_OPTS", "KAFKA_JMX_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_GC_LOG_OPTS", "KAFKA_LOG4J_ROOT_LOGLEVEL",
    "KAFKA_LOG4J_LOGGERS", "KAFKA_TOOLS_LOG4J_LOGLEVEL", "KAFKA_JMX_HOSTNAME",
})  # fmt: skip

# The defaults of kafka-server-start.sh and kafka-run-class.sh.
DEFAULT_HEAP_OPTS = "-Xmx1G -Xms1G"
DEFAULT_JVM_PERFORMANCE_OPTS = (
    "-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 "
    "-XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -Djava.awt.headless=true"
)
# The storage tool runs for a second: without the optimizing compiler and G1's set-up it
# starts in 1.1 s instead of 2 s here.
TOOL_JVM_OPTS = "-Xmx256M -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")
_LISTENER = re.compile(r"^(?P<name>[^:/]+)://(?P<host>\[[^\]]*\]|[^:]*):(?P<port>\d+)$")


class BrokerConfigError(ValueError):
    """The environment describes no broker the image would start; the message says why."""


@dataclass(frozen=True)
class BrokerConfig:
    """Everything a start needs, parsed once from the environment."""

    properties: tuple[tuple[str, str], ...]
    """server.properties, sorted by name."""
    cluster_id: str
    heap_opts: str
    jvm_performance_opts: str
    opts: str
    """KAFKA_OPTS: the user's own JVM options, last."""
    root_log_level: str
    loggers: tuple[tuple[str, str], ...]
    """(logger, level) pairs from KAFKA_LOG4J_LOGGERS."""

    def property(self, name: str) -> str | None:
        return dict(self.properties).get(name)


@dataclass(frozen=True)
class NodeSettings:
    """One Kafka node that is both broker and controller, on one host."""

    log_dir: str
    port: int = 9092
    controller_port: int = 9093
    node_id: int = 1
    host: str = "127.0.0.1"
    """Where both listeners bind."""
    advertised_host: str | None = None
    """The name clients are told to connect to (the host when None)."""

    def image_env(self) -> dict[str, str]:
        """The apache/kafka image's variables for this node."""
        advertised = self.advertised_host or self.host
        return {
            "KAFKA_NODE_ID": str(self.node_id),
            "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_LISTENERS": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{advertised}:{self.port}",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": f"{self.node_id}@{self.host}:{self.controller_port}",
            "KAFKA_LOG_DIRS": self.log_dir,
            # One node: the internal topics cannot have their default three replicas, and a
            # transaction needs its state log's minimum in-sync replicas met by this one.
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
            # A consumer group's first member need not wait 3 s for others.
            "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        }


def property_name(variable: str) -> str:
    """`KAFKA_LOG_DIRS` -> `log.dirs`, `KAFKA_A__B` -> `a_b`, `KAFKA_A___B` -> `a-b` (the image's rule)."""
    name = variable.removeprefix("KAFKA_").lower().replace("_", ".")
    return name.replace("...", "-").replace("..", "_")


def config_from_env(env: Mapping[str, str], bind_host: str | None = None) -> BrokerConfig:
    """The broker the image would start with this environment. Pure."""
    variables = {k: v for k, v in env.items() if k.startswith("KAFKA_") and k not in NOT_PROPERTIES}
    roles = env.get("KAFKA_PROCESS_ROLES", "")
    if roles == "controller" and env.get("KAFKA_ADVERTISED_LISTENERS"):
        raise BrokerConfigError("KAFKA_ADVERTISED_LISTENERS is not supported on a KRaft controller.")
    if "KAFKA_LISTENERS" not in variables and roles != "controller" and env.get("KAFKA_ADVERTISED_LISTENERS"):
        variables["KAFKA_LISTENERS"] = re.sub(r"://[^:]*:", "://0.0.0.0:", env["KAFKA_ADVERTISED_LISTENERS"])
    properties = {property_name(k): v for k, v in variables.items()} if variables else dict(IMAGE_DEFAULTS)
    if bind_host is not None and "listeners" in properties:
        properties["listeners"] = bind_listeners(properties["listeners"], bind_host)
    return BrokerConfig(
        properties=tuple(sorted(properties.items())),
        cluster_id=env.get("CLUSTER_ID") or DEFAULT_CLUSTER_ID,
        heap_opts=env.get("KAFKA_HEAP_OPTS") or DEFAULT_HEAP_OPTS,
        jvm_performance_opts=env.get("KAFKA_JVM_PERFORMANCE_OPTS") or DEFAULT_JVM_PERFORMANCE_OPTS,
        opts=env.get("KAFKA_OPTS", ""),
        root_log_level=env.get("KAFKA_LOG4J_ROOT_LOGLEVEL") or "INFO",
        loggers=_loggers(env.get("KAFKA_LOG4J_LOGGERS", "")),
    )


def bind_listeners(listeners: str, host: str) -> str:
    """Each listener whose host is a wildcard, bound to `host` instead."""
    bound = []
    for listener in listeners.split(","):
        match = _LISTENER.match(listener.strip())
        if match is None:
            raise BrokerConfigError(f"listener {listener!r} is not NAME://HOST:PORT")
        if match["host"] in WILDCARD_HOSTS:
            listener = f"{match['name']}://{host}:{match['port']}"
        bound.append(listener.strip())
    return ",".join(bound)


def _loggers(text: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, level = item.partition("=")
        if not sep or not name.strip() or not level.strip():
            raise BrokerConfigError(f"KAFKA_LOG4J_LOGGERS: {item!r} is not logger=LEVEL")
        pairs.append((name.strip(), level.strip()))
    return tuple(pairs)


def server_properties(config: BrokerConfig) -> str:
    return "".join(f"{name}={_escape(value)}\n" for name, value in config.properties)


def _escape(value: str) -> str:
    # java.util.Properties reads a backslash as an escape and a line break as the value's end.
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def log4j_config(root_level: str, loggers: Sequence[tuple[str, str]] = ()) -> str:
    """A log4j2 configuration (properties syntax) that writes everything to stdout, as the image's."""
    lines = [
        "appender.stdout.type = Console",
        "appender.stdout.name = STDOUT",
        "appender.stdout.layout.type = PatternLayout",
        "appender.stdout.layout.pattern = [%d] %p %m (%c)%n",
        f"rootLogger.level = {root_level}",
        "rootLogger.appenderRef.stdout.ref = STDOUT",
    ]
    for index, (name, level) in enumerate(loggers):
        lines += [f"logger.l{index}.name = {name}", f"logger.l{index}.level = {level}"]
    return "\n".join(lines) + "\n"


def java_binary(env: Mapping[str, str]) -> str:
    """$JAVA_HOME/bin/java, else java on the PATH (as kafka-run-class.sh)."""
    home = env.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else "java"


def format_argv(java: str, jars: Path, config_dir: Path, config: BrokerConfig) -> list[str]:
    """The storage tool: formats each log folder once, leaves formatted ones alone."""
    return [
        java, *TOOL_JVM_OPTS.split(), f"-Dlog4j2.configurationFile={config_dir / 'tools-log4j2.properties'}",
        "-cp", str(jars / "*"), "kafka.tools.StorageTool", "format",
        "--cluster-id", config.cluster_id, "--config", str(config_dir / "server.properties"), "--ignore-formatted",
    ]  # fmt: skip


def server_argv(java: str, jars: Path, config_dir: Path, config: BrokerConfig) -> list[str]:
    return [
        java, *config.heap_opts.split(), *config.jvm_performance_opts.split(), *config.opts.split(),
        f"-Dlog4j2.configurationFile={config_dir / 'log4j2.properties'}",
        "-cp", str(jars / "*"), "kafka.Kafka", str(config_dir / "server.properties"),
    ]  # fmt: skip


def check_jars(jars: Path) -> None:
    if not list(jars.glob("kafka_2.13-*.jar")):
        raise BrokerConfigError(f"no Kafka broker jars in {jars}: run `make kafka`")


def write_config(config_dir: Path, config: BrokerConfig) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "server.properties").write_text(server_properties(config))
    (config_dir / "log4j2.properties").write_text(log4j_config(config.root_log_level, config.loggers))
    (config_dir / "tools-log4j2.properties").write_text(log4j_config("WARN"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m localcluster.kafka", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jars", type=Path, default=DEFAULT_JARS, help="the broker's jars (default: .cache/kafka)")
    parser.add_argument("--config-dir", type=Path, default=Path("config"), help="where server.properties goes")
    parser.add_argument("--bind-host", help="the host that replaces the listeners' wildcard hosts")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        config = config_from_env(env, args.bind_host)
        check_jars(args.jars)
    except BrokerConfigError as e:
        sys.exit(f"kafka: {e}")
    config_dir = args.config_dir.absolute()
    write_config(config_dir, config)
    java = java_binary(env)
    formatted = subprocess.run(format_argv(java, args.jars, config_dir, config), stdin=subprocess.DEVNULL)
    if formatted.returncode != 0:
        sys.exit(f"kafka: formatting the storage failed (exit code {formatted.returncode})")
    sys.stdout.flush()
    os.execvp(java, server_argv(java, args.jars, config_dir, config))


if __name__ == "__main__":
    main()
