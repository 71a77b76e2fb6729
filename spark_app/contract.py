"""The contract between the operator and the driver: which environment variables the
operator injects into a driver pod, and how the driver reads them.

Both sides import this module (the operator through ``spark_app.contract`` only, which
needs neither pyspark nor boto3), and tests/unit/spark_app/test_contract.py checks that
what the operator's pod builder writes is what ``Config.from_env`` reads. Secrets never pass
through here: S3 credentials reach the driver as the standard AWS variables, which the
operator fills from a Secret with ``secretKeyRef``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

METADATA_URI = "SPARK_APP_METADATA_URI"
SNAPSHOT_URI = "SPARK_APP_SNAPSHOT_URI"
S3_ENDPOINT = "SPARK_APP_S3_ENDPOINT"
S3_REGION = "SPARK_APP_S3_REGION"
S3_PATH_STYLE = "SPARK_APP_S3_PATH_STYLE"
SNAPSHOT_INTERVAL_MS = "SPARK_APP_SNAPSHOT_INTERVAL_MS"
EPOCH = "SPARK_APP_EPOCH"
PIPELINE = "SPARK_APP_PIPELINE"
SPARK_CONF = "SPARK_APP_SPARK_CONF"
DEAD_LETTER_URI = "SPARK_APP_DEAD_LETTER_URI"
OUTAGE_BUDGET_SECONDS = "SPARK_APP_OUTAGE_BUDGET_SECONDS"
MAX_FILES_PER_TRIGGER = "SPARK_APP_MAX_FILES_PER_TRIGGER"
MAX_BYTES_PER_TRIGGER = "SPARK_APP_MAX_BYTES_PER_TRIGGER"
# Filled by the operator from the downward API; with both set, the driver reports its
# progress in an annotation on its own pod, which the operator watches.
POD_NAME = "SPARK_APP_POD_NAME"
POD_NAMESPACE = "SPARK_APP_POD_NAMESPACE"
EXECUTOR_POD_TEMPLATE = "SPARK_APP_EXECUTOR_POD_TEMPLATE"
"""Kubernetes execution only: the JSON of the Pod that Spark builds each executor from (its
restricted security context, scratch volumes, and the S3 credentials as secretKeyRef). The
driver writes it to a file and names it in spark.kubernetes.executor.podTemplateFile
(``executor_pod_template_conf``)."""
LIVE_SETTINGS_FILE = "SPARK_APP_LIVE_SETTINGS_FILE"
"""A file the driver reads again while it runs, for the settings that change without a
restart (``LiveSettings``): on Kubernetes a downward API volume of the pod's
LIVE_SETTINGS_ANNOTATION, which the kubelet rewrites when the operator changes it."""
LIVE_SETTINGS_ANNOTATION = "sparkapp.dev/live-settings"
EXECUTOR_CONTAINER = "executor"
"""The container of EXECUTOR_POD_TEMPLATE that Spark turns into the executor's."""
TABLE_INPUTS = "SPARK_APP_TABLE_INPUTS"
"""A reader's shared tables (spec.inputs), resolved by the operator: a JSON list of
``TableInput`` (where each table is reached; never credentials)."""
TABLES = "SPARK_APP_TABLES"
"""A publisher's table settings (spec.tables): a JSON object of ``TableSettings`` by name."""
TABLE_CREDENTIALS_PREFIX = "SPARK_APP_TABLE_"
"""A table input with S3 credentials of its own gets them as ``SPARK_APP_TABLE_<n>_AWS_*``
variables, filled from the reader's own Secret with secretKeyRef."""
# The Kafka connection of spec.kafka: what sa.io.kafka reaches when a pipeline names no
# broker itself. The SASL username and password come only as secretKeyRef (never values).
KAFKA_BOOTSTRAP_SERVERS = "SPARK_APP_KAFKA_BOOTSTRAP_SERVERS"
KAFKA_SECURITY_PROTOCOL = "SPARK_APP_KAFKA_SECURITY_PROTOCOL"
KAFKA_SASL_MECHANISM = "SPARK_APP_KAFKA_SASL_MECHANISM"
KAFKA_SASL_USERNAME = "SPARK_APP_KAFKA_SASL_USERNAME"
KAFKA_SASL_PASSWORD = "SPARK_APP_KAFKA_SASL_PASSWORD"
KAFKA_CA_FILE = "SPARK_APP_KAFKA_CA_FILE"
"""A PEM file of the certificates that sign the brokers' (a Secret or ConfigMap mounted
by the operator at KAFKA_CA_MOUNT)."""
KAFKA_CA_MOUNT = "/etc/spark-app/kafka-ca"

# What else a driver process reads from its environment (not injected by the operator):
# set by the image, the entrypoint, a test or a developer. DriverEnvironment parses them.
PIPELINE_FILE = "SPARK_APP_PIPELINE_FILE"
"""The pipeline file or module being run (set by the entrypoint; names the lease holder)."""
TERMINATION_LOG_PATH = "SPARK_APP_TERMINATION_LOG"
"""Where the final message goes, instead of Kubernetes' /dev/termination-log (tests)."""
SPARK_LOG_LEVEL = "SPARK_APP_SPARK_LOG_LEVEL"
"""Spark's log level (WARN by default)."""
JARS_DIR = "SPARK_APP_JARS_DIR"
"""The folder of JVM packages added to Spark's own (the image sets it)."""
CLASS_ARCHIVES = "SPARK_APP_CLASS_ARCHIVES"
"""The folder of the driver JVM's class archives (the image sets it)."""
EXECUTOR_WORK_DIR = "SPARK_APP_EXECUTOR_WORK_DIR"
"""An executor's scratch folder (its working directory)."""
STATUS_ANNOTATION = "sparkapp.dev/status"
"""The driver's ``DriverReport`` as JSON, on its own pod, while it changes (and every few
seconds anyway)."""

# The standard AWS variables; listed so that the operator and the tests name them once.
AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
AWS_SESSION_TOKEN = "AWS_SESSION_TOKEN"

ALL = (
    METADATA_URI,
    SNAPSHOT_URI,
    S3_ENDPOINT,
    S3_REGION,
    S3_PATH_STYLE,
    SNAPSHOT_INTERVAL_MS,
    EPOCH,
    PIPELINE,
    SPARK_CONF,
    DEAD_LETTER_URI,
    OUTAGE_BUDGET_SECONDS,
    MAX_FILES_PER_TRIGGER,
    MAX_BYTES_PER_TRIGGER,
    POD_NAME,
    POD_NAMESPACE,
    EXECUTOR_POD_TEMPLATE,
    TABLE_INPUTS,
    TABLES,
    LIVE_SETTINGS_FILE,
    KAFKA_BOOTSTRAP_SERVERS,
    KAFKA_SECURITY_PROTOCOL,
    KAFKA_SASL_MECHANISM,
    KAFKA_SASL_USERNAME,
    KAFKA_SASL_PASSWORD,
    KAFKA_CA_FILE,
)


# How a driver process ends; the operator reads these from the pod's exit code.
EXIT_OK = 0
"""Stopped cleanly (SIGTERM, or a run that stops when idle): the last batch is committed."""
EXIT_FAILED = 1
"""An unexpected failure: retrying may help."""
EXIT_MISCONFIGURED = 2
"""Retrying cannot help until something is changed: bad storage settings or credentials,
a pipeline whose code no longer matches its stored state, a malformed pipeline."""
EXIT_FENCED = 3
"""A driver with a higher epoch took over, or this driver's epoch is stale. A stale epoch's
termination message starts with STALE_EPOCH_PREFIX followed by the stored epoch, so
that the operator can relaunch with a higher one."""
STALE_EPOCH_PREFIX = "stale epoch; stored epoch is "
EXIT_ALREADY_RUNNING = 4
"""Another live driver holds the pipeline's lease (local runs only)."""
EXIT_STORAGE_UNAVAILABLE = 5
"""The state's storage stayed unreachable for longer than the driver's outage budget. A
transient condition: the operator relaunches with capped backoff, without counting it as
a failure, until storage is back."""

EXIT_TABLE_VERSIONS_GONE = 6
"""A shared table this reader reads no longer holds the versions it needs (its hold was
broken for being older than the table's maximum hold age, or released): retrying cannot
help; the reader must be rebuilt from empty state (a reset), which reads the table afresh."""

TERMINATION_LOG = "/dev/termination-log"
"""Where a driver writes its final one-line message (Kubernetes' terminationMessagePath)."""


TERMINATION_MESSAGE_LIMIT = 4096
"""Kubernetes keeps at most this many bytes of a termination message."""


def write_termination_message(message: str, path: str = TERMINATION_LOG) -> None:
    """The driver's last word, which Kubernetes copies into the pod's status (and the
    operator into the pipeline's): scrubbed of credentials, cut to what Kubernetes keeps.
    Best effort."""
    data = scrub_credentials(message).encode()[:TERMINATION_MESSAGE_LIMIT].decode(errors="ignore")
    try:
        with open(path, "w") as handle:
            handle.write(data)
    except OSError:
        pass


class ContractError(ValueError):
    """An injected variable is missing or malformed; the message names it."""


@dataclass(frozen=True)
class S3Options:
    """How to reach an S3-compatible store (never credentials): one type for the
    PersistentPipeline's spec, the driver's storage backends, its sources and dead
    letters, and the cleanup pod, so that they address S3 alike."""

    endpoint: str | None = None
    """An S3-compatible server; None means AWS."""
    region: str | None = None
    path_style: bool | None = None
    """Path-style addressing; None: on with an endpoint (most S3-compatible servers need
    it), off for AWS."""

    @property
    def path_style_addressing(self) -> bool:
        return bool(self.endpoint) if self.path_style is None else self.path_style

    def to_env(self) -> dict[str, str]:
        env = {S3_PATH_STYLE: "true" if self.path_style_addressing else "false"}
        if self.endpoint:
            env[S3_ENDPOINT] = self.endpoint
        if self.region:
            env[S3_REGION] = self.region
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> S3Options:
        path_style = environ.get(S3_PATH_STYLE, "").strip().lower()
        if path_style not in ("", "true", "false"):
            raise ContractError(f"{S3_PATH_STYLE}={environ[S3_PATH_STYLE]!r} must be true or false")
        return cls(endpoint=environ.get(S3_ENDPOINT) or None, region=environ.get(S3_REGION) or None,
                   path_style=None if not path_style else path_style == "true")


KAFKA_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class KafkaConnection:
    """How to reach a Kafka cluster: one type for the PersistentPipeline's spec.kafka, the
    driver's environment, Spark's Kafka source and the sink's producer."""

    bootstrap_servers: str
    """host:port[,host:port...]"""
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    """PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, with SASL_PLAINTEXT or SASL_SSL."""
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    """From a Secret (secretKeyRef); never printed, logged or put in arguments."""
    ca_file: str | None = None
    """A PEM file of the CAs that sign the brokers' certificates (SSL, SASL_SSL); None: the
    system's."""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ContractError("the Kafka bootstrap servers are empty: give host:port[,host:port...]")
        if self.security_protocol not in KAFKA_SECURITY_PROTOCOLS:
            raise ContractError(f"Kafka security protocol {self.security_protocol!r} is not one of "
                                f"{', '.join(KAFKA_SECURITY_PROTOCOLS)}")
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and self.sasl_mechanism not in KAFKA_SASL_MECHANISMS:
            raise ContractError(f"Kafka security protocol {self.security_protocol} needs a SASL mechanism, one of "
                                f"{', '.join(KAFKA_SASL_MECHANISMS)} (got {self.sasl_mechanism!r})")
        if sasl and (not self.username or self.password is None):
            raise ContractError(f"Kafka security protocol {self.security_protocol} needs a username and a password "
                                f"({KAFKA_SASL_USERNAME}, {KAFKA_SASL_PASSWORD}, from a Secret)")
        if not sasl and self.sasl_mechanism:
            raise ContractError(f"a Kafka SASL mechanism ({self.sasl_mechanism}) needs security protocol "
                                "SASL_PLAINTEXT or SASL_SSL")

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def to_env(self) -> dict[str, str]:
        """The settings that are not secrets (the username and the password are the
        operator's secretKeyRef)."""
        env = {KAFKA_BOOTSTRAP_SERVERS: self.bootstrap_servers, KAFKA_SECURITY_PROTOCOL: self.security_protocol}
        if self.sasl_mechanism:
            env[KAFKA_SASL_MECHANISM] = self.sasl_mechanism
        if self.ca_file:
            env[KAFKA_CA_FILE] = self.ca_file
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> KafkaConnection | None:
        """The connection the operator injected, or None if it injected none."""
        servers = environ.get(KAFKA_BOOTSTRAP_SERVERS, "").strip()
        if not servers:
            return None
        return cls(
            bootstrap_servers=servers,
            security_protocol=(environ.get(KAFKA_SECURITY_PROTOCOL) or "PLAINTEXT").strip().upper(),
            sasl_mechanism=(environ.get(KAFKA_SASL_MECHANISM) or "").strip().upper() or None,
            username=environ.get(KAFKA_SASL_USERNAME) or None,
            password=environ.get(KAFKA_SASL_PASSWORD),
            ca_file=environ.get(KAFKA_CA_FILE) or None,
        )


@dataclass(frozen=True)
class S3Keys:
    """S3 credentials read from a driver's environment (where secretKeyRef put them);
    never printed."""

    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], prefix: str) -> S3Keys | None:
        key_id, secret = environ.get(prefix + AWS_ACCESS_KEY_ID), environ.get(prefix + AWS_SECRET_ACCESS_KEY)
        if not key_id or not secret:
            return None
        return cls(key_id, secret, environ.get(prefix + AWS_SESSION_TOKEN) or None)


@dataclass(frozen=True)
class TableInput:
    """A shared table a reader reads, as the operator resolved it from spec.inputs."""

    table: str
    """namespace/pipeline/name."""
    uri: str
    """The table's folder as the driver reaches it: a path (the publisher's claim, mounted)
    or s3://bucket/prefix/tables/name."""
    s3: S3Options = field(default_factory=S3Options)
    credentials: str = ""
    """The prefix of the variables holding this table's own S3 credentials (TABLE_CREDENTIALS_PREFIX
    + index + '_'), or "" to reach it as the driver reaches its own state."""

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "uri": self.uri, "s3": asdict(self.s3), "credentials": self.credentials}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> TableInput:
        return cls(table=str(value["table"]), uri=str(value["uri"]), s3=S3Options(**(value.get("s3") or {})),
                   credentials=str(value.get("credentials") or ""))


@dataclass(frozen=True)
class TableSettings:
    """What a publisher's spec.tables says of one of its tables."""

    max_hold_age_seconds: int | None = None
    """A reader's hold behind for longer than this is broken (None: holds are kept for ever)."""


def table_inputs_from_env(environ: Mapping[str, str]) -> tuple[TableInput, ...]:
    raw = environ.get(TABLE_INPUTS)
    if not raw:
        return ()
    try:
        value = json.loads(raw)
        return tuple(TableInput.from_json(item) for item in value)
    except (ValueError, TypeError, KeyError) as error:
        raise ContractError(f"{TABLE_INPUTS} is not a JSON list of table inputs: {error}") from None


def table_settings_from_env(environ: Mapping[str, str]) -> dict[str, TableSettings]:
    raw = environ.get(TABLES)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
        return {str(name): TableSettings(max_hold_age_seconds=_optional_int(item.get("max_hold_age_seconds")))
                for name, item in value.items()}
    except (ValueError, TypeError, AttributeError) as error:
        raise ContractError(f"{TABLES} is not a JSON object of table settings: {error}") from None


def tables_to_env(inputs: tuple[TableInput, ...], settings: Mapping[str, TableSettings]) -> dict[str, str]:
    env = {}
    if inputs:
        env[TABLE_INPUTS] = json.dumps([i.to_json() for i in inputs], sort_keys=True)
    if settings:
        env[TABLES] = json.dumps({n: asdict(s) for n, s in sorted(settings.items())}, sort_keys=True)
    return env


@dataclass(frozen=True)
class InjectedConfig:
    """Everything the operator tells a driver, as plain values."""

    metadata_uri: str
    """Where the metadata log and the lease live: a path, or s3://bucket/prefix."""
    snapshot_uri: str
    """Where Spark checkpoints, operator state and snapshots live; often the same as metadata_uri."""
    snapshot_interval_ms: int
    """How far the stored snapshot of state may fall behind; the changelog covers the rest."""
    epoch: int | None = None
    """The fencing token: a driver with a lower epoch can never commit after this one started."""
    pipeline: str = ""
    """namespace/name of the PersistentPipeline: the lease holder, and the owner of the state."""
    s3: S3Options = field(default_factory=S3Options)
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    """Extra Spark configuration (spark.master, executor settings, ...)."""
    dead_letter_uri: str | None = None
    """Where malformed input rows go; defaults to beside the first output."""
    outage_budget_seconds: int | None = None
    """How long the driver rides out a storage outage before it exits with
    EXIT_STORAGE_UNAVAILABLE (None: the runtime's default)."""
    max_files_per_trigger: int | None = None
    """The default bound of a file source's batch in files (a source may set its own)."""
    max_bytes_per_trigger: int | None = None
    """The default bound of a file source's batch in bytes."""
    table_inputs: tuple[TableInput, ...] = ()
    """The shared tables this pipeline reads (spec.inputs)."""
    tables: Mapping[str, TableSettings] = field(default_factory=dict)
    """Settings of the tables this pipeline publishes (spec.tables)."""

    def to_env(self) -> dict[str, str]:
        env = {
            METADATA_URI: self.metadata_uri,
            SNAPSHOT_URI: self.snapshot_uri,
            SNAPSHOT_INTERVAL_MS: str(self.snapshot_interval_ms),
            PIPELINE: self.pipeline,
            **self.s3.to_env(),
        }
        if self.epoch is not None:
            env[EPOCH] = str(self.epoch)
        if self.spark_conf:
            env[SPARK_CONF] = json.dumps(dict(self.spark_conf), sort_keys=True)
        if self.dead_letter_uri:
            env[DEAD_LETTER_URI] = self.dead_letter_uri
        for name, value in ((OUTAGE_BUDGET_SECONDS, self.outage_budget_seconds),
                            (MAX_FILES_PER_TRIGGER, self.max_files_per_trigger),
                            (MAX_BYTES_PER_TRIGGER, self.max_bytes_per_trigger)):
            if value is not None:
                env[name] = str(value)
        env.update(tables_to_env(self.table_inputs, self.tables))
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> InjectedConfig:
        if not environ.get(METADATA_URI):
            raise ContractError(
                f"{METADATA_URI} is not set: the driver was not started by the operator; "
                "pass a persistence config to spark_app.run() instead"
            )
        metadata_uri = environ[METADATA_URI]
        return cls(
            metadata_uri=metadata_uri,
            snapshot_uri=environ.get(SNAPSHOT_URI) or metadata_uri,
            snapshot_interval_ms=_positive_int(environ, SNAPSHOT_INTERVAL_MS, default=None) or 10_000,
            epoch=_positive_int(environ, EPOCH, default=None),
            pipeline=environ.get(PIPELINE, ""),
            s3=S3Options.from_env(environ),
            spark_conf=_json_object(environ, SPARK_CONF),
            dead_letter_uri=environ.get(DEAD_LETTER_URI) or None,
            outage_budget_seconds=_positive_int(environ, OUTAGE_BUDGET_SECONDS, default=None),
            max_files_per_trigger=_positive_int(environ, MAX_FILES_PER_TRIGGER, default=None),
            max_bytes_per_trigger=_positive_int(environ, MAX_BYTES_PER_TRIGGER, default=None),
            table_inputs=table_inputs_from_env(environ),
            tables=table_settings_from_env(environ),
        )


def _positive_int(environ: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ContractError(f"{name}={raw!r} is not an integer") from None
    if value <= 0:
        raise ContractError(f"{name}={raw!r} must be positive")
    return value


def _json_object(environ: Mapping[str, str], name: str) -> dict[str, str]:
    raw = environ.get(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ContractError(f"{name} is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ContractError(f"{name} must be a JSON object of Spark settings")
    return {str(k): str(v) for k, v in value.items()}


@dataclass(frozen=True)
class DriverEnvironment:
    """Everything a driver process reads from its environment, parsed once when the
    pipeline is declared and passed down from there."""

    injected: InjectedConfig | None
    """What the operator injected; None for a local run."""
    epoch: int | None = None
    """A fencing token: the operator's, or a local supervisor's (or a test's)."""
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    s3: S3Options = field(default_factory=S3Options)
    """How the pipeline's own S3 paths (its sources, its dead letters) are reached."""
    pipeline_file: str = ""
    termination_log: str = TERMINATION_LOG
    spark_log_level: str = "WARN"
    pod_name: str | None = None
    pod_namespace: str | None = None
    table_inputs: tuple[TableInput, ...] = ()
    """The shared tables the operator resolved for this reader."""
    table_keys: Mapping[str, S3Keys] = field(default_factory=dict)
    """A table input's own S3 credentials, by its ``credentials`` prefix."""
    tables: Mapping[str, TableSettings] = field(default_factory=dict)
    kafka: KafkaConnection | None = None
    """The Kafka cluster of spec.kafka, credentials included; None if none was given."""
    live_settings_file: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> DriverEnvironment:
        injected = InjectedConfig.from_env(environ) if environ.get(METADATA_URI) else None
        inputs = table_inputs_from_env(environ)
        keys = {i.credentials: k for i in inputs if i.credentials
                if (k := S3Keys.from_env(environ, i.credentials)) is not None}
        return cls(
            injected=injected,
            epoch=_positive_int(environ, EPOCH, default=None),
            spark_conf=_json_object(environ, SPARK_CONF),
            s3=S3Options.from_env(environ),
            pipeline_file=environ.get(PIPELINE_FILE, ""),
            termination_log=environ.get(TERMINATION_LOG_PATH) or TERMINATION_LOG,
            spark_log_level=environ.get(SPARK_LOG_LEVEL) or "WARN",
            pod_name=environ.get(POD_NAME) or None,
            pod_namespace=environ.get(POD_NAMESPACE) or None,
            table_inputs=inputs,
            table_keys=keys,
            tables=table_settings_from_env(environ),
            kafka=KafkaConnection.from_env(environ),
            live_settings_file=environ.get(LIVE_SETTINGS_FILE) or None,
        )


@dataclass(frozen=True)
class LiveSettings:
    """What the operator changes in a running driver (LIVE_SETTINGS_FILE), as JSON:
    ``{"backfill": {"<persistent id>": {"rowsPerSecond": 1000}}}``; a null rate is
    unlimited, 0 pauses the backfill."""

    backfill_rates: Mapping[str, float | None] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"backfill": {pid: {"rowsPerSecond": rate} for pid, rate in self.backfill_rates.items()}},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> LiveSettings:
        """Raises ContractError naming what is wrong."""
        try:
            raw = json.loads(text or "{}")
            rates: dict[str, float | None] = {}
            for pid, entry in (raw.get("backfill") or {}).items():
                rate = entry.get("rowsPerSecond")
                if rate is not None and (not isinstance(rate, (int, float)) or rate < 0):
                    raise ContractError(f"backfill.{pid}.rowsPerSecond must be a number ≥ 0 or null, got {rate!r}")
                rates[str(pid)] = None if rate is None else float(rate)
            return cls(rates)
        except (ValueError, AttributeError, TypeError) as error:
            raise ContractError(f"live settings are not of the expected shape: {error}") from None


@dataclass(frozen=True)
class QueryReport:
    """One output's progress, as its driver reports it: the last commit and what waits."""

    batch: int | None = None
    """The last committed batch (None: none yet)."""
    batch_time_ms: int | None = None
    commit_time_ms: int | None = None
    offsets: Mapping[str, Any] = field(default_factory=dict)
    """persistent_id -> the source's committed offset."""
    backlog: bool = False
    """Input is waiting."""
    active: bool = False
    """A batch is running."""
    malformed: int = 0
    """Rows set aside in the dead letters, in all."""
    file_problems: int = 0
    """Input files that vanished or changed after they were admitted, in all."""
    iterate: Any = None
    """The iterate operator's last run, if the output is fed by one."""
    input_rows_per_s: float | None = None
    lag: Mapping[str, Mapping[str, Mapping[str, int]]] = field(default_factory=dict)
    """Kafka sources: persistent_id -> topic -> partition -> records beyond the committed offset."""

    @property
    def total_lag(self) -> int | None:
        """Records waiting in all Kafka partitions (None: no Kafka source reported)."""
        if not self.lag:
            return None
        return sum(n for topics in self.lag.values() for parts in topics.values() for n in parts.values())


@dataclass(frozen=True)
class HolderReport:
    """A reader's hold on a published table, as its publisher sees it."""

    reader: str
    """namespace/pipeline/persistent id."""
    kind: str
    """changelog or lookup."""
    version: int
    """The oldest version the reader may still need."""
    behind: int = 0
    """Versions the reader has not consumed yet."""
    age_s: float | None = None
    """How long the oldest version it has not consumed has existed (0: current)."""
    broken: bool = False
    """Broken for being older than the table's maximum hold age."""
    blocking: bool = False
    """Its hold is what keeps the table's compaction from going further."""


@dataclass(frozen=True)
class TableReport:
    """A published table, as its publisher reports it."""

    version: int | None = None
    """The latest committed version."""
    rows: int | None = None
    bytes: int | None = None
    """What the table's folder holds (data, change data and log), as of the last compaction."""
    frontier: int | None = None
    """The oldest version the last compaction kept whole."""
    compacted_ms: int | None = None
    holders: tuple[HolderReport, ...] = ()


@dataclass(frozen=True)
class BackfillReport:
    """A table source's backfill: rows read of the table's, how fast, how long to go."""

    rows_read: int
    rows_total: int
    percent: float
    rows_per_second: float | None = None
    eta_seconds: float | None = None
    paused: bool = False
    finished: bool = False
    version: int | None = None
    """The table version the reader's input has reached."""

    def describe(self) -> str:
        """For a status column: "37.5% 1.2k rows/s ETA 4m", "paused at 37.5%", "done"."""
        if self.finished:
            return "done"
        if self.paused:
            return f"paused at {self.percent:g}%"
        text = f"{self.percent:g}%"
        if self.rows_per_second:
            text += f" {_short(self.rows_per_second)} rows/s"
        if self.eta_seconds is not None:
            text += f" ETA {_duration(self.eta_seconds)}"
        return text


def _short(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.0f}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


@dataclass(frozen=True)
class DriverReport:
    """The driver's own account of its progress, written on its pod (STATUS_ANNOTATION)
    and read by the operator: both sides use this type."""

    epoch: int | None
    stored_epoch: int | None
    """The newest epoch found in storage when this driver started (0: new state)."""
    state: str
    """starting, running or stopping."""
    reported_at: float | None = None
    """When it was sent (seconds since the epoch); stamped by the sender."""
    queries: Mapping[str, QueryReport] = field(default_factory=dict)
    tables: Mapping[str, TableReport] = field(default_factory=dict)
    """The tables this driver publishes."""
    backfills: Mapping[str, BackfillReport] = field(default_factory=dict)
    """persistent_id -> the backfill of a table source."""

    @property
    def idle(self) -> bool:
        """Running with nothing to do: an idle stream commits nothing and is healthy."""
        return self.state == "running" and not any(q.backlog or q.active for q in self.queries.values())

    @property
    def last_commit_ms(self) -> int | None:
        times = [q.commit_time_ms for q in self.queries.values() if q.commit_time_ms is not None]
        return max(times) if times else None

    def to_json(self) -> str:
        body: dict[str, Any] = {
            "epoch": self.epoch, "stored_epoch": self.stored_epoch, "state": self.state,
            "queries": {name: asdict(q) for name, q in self.queries.items()},
        }
        if self.tables:
            body["tables"] = {name: asdict(t) for name, t in self.tables.items()}
        if self.backfills:
            body["backfills"] = {pid: asdict(b) for pid, b in self.backfills.items()}
        if self.reported_at is not None:
            body["reported_ms"] = int(self.reported_at * 1000)
        return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)

    @classmethod
    def from_json(cls, text: str | None) -> DriverReport | None:
        """A sent report (stamped), or None if absent or not of this shape (a driver of
        another version, a hand edit)."""
        if not text:
            return None
        try:
            raw = json.loads(text)
            queries = {str(name): _query_report(q) for name, q in (raw.get("queries") or {}).items()}
            tables = {str(name): _table_report(t) for name, t in (raw.get("tables") or {}).items()}
            backfills = {str(pid): _backfill_report(b) for pid, b in (raw.get("backfills") or {}).items()}
            return cls(epoch=_optional_int(raw.get("epoch")), stored_epoch=_optional_int(raw.get("stored_epoch")),
                       state=str(raw.get("state") or "starting"), reported_at=int(raw["reported_ms"]) / 1000,
                       queries=queries, backfills=backfills, tables=tables)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def _query_report(raw: Mapping[str, Any]) -> QueryReport:
    rate = raw.get("input_rows_per_s")
    return QueryReport(
        batch=_optional_int(raw.get("batch")), batch_time_ms=_optional_int(raw.get("batch_time_ms")),
        commit_time_ms=_optional_int(raw.get("commit_time_ms")), offsets=dict(raw.get("offsets") or {}),
        backlog=bool(raw.get("backlog")), active=bool(raw.get("active")), malformed=int(raw.get("malformed") or 0),
        file_problems=int(raw.get("file_problems") or 0), iterate=raw.get("iterate"),
        input_rows_per_s=None if rate is None else float(rate), lag=_lag(raw.get("lag")),
    )


def _table_report(raw: Mapping[str, Any]) -> TableReport:
    holders = tuple(
        HolderReport(reader=str(h["reader"]), kind=str(h.get("kind") or ""), version=int(h["version"]),
                     behind=int(h.get("behind") or 0),
                     age_s=None if h.get("age_s") is None else float(h["age_s"]),
                     broken=bool(h.get("broken")), blocking=bool(h.get("blocking")))
        for h in raw.get("holders") or [])
    return TableReport(version=_optional_int(raw.get("version")), rows=_optional_int(raw.get("rows")),
                       bytes=_optional_int(raw.get("bytes")), frontier=_optional_int(raw.get("frontier")),
                       compacted_ms=_optional_int(raw.get("compacted_ms")), holders=holders)


def _lag(raw: Any) -> dict[str, dict[str, dict[str, int]]]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(pid): {str(topic): {str(p): int(n) for p, n in parts.items()} for topic, parts in topics.items()}
            for pid, topics in raw.items()}


def _backfill_report(raw: Mapping[str, Any]) -> BackfillReport:
    rate, eta = raw.get("rows_per_second"), raw.get("eta_seconds")
    return BackfillReport(
        rows_read=int(raw["rows_read"]), rows_total=int(raw["rows_total"]), percent=float(raw["percent"]),
        rows_per_second=None if rate is None else float(rate), eta_seconds=None if eta is None else float(eta),
        paused=bool(raw.get("paused")), finished=bool(raw.get("finished")), version=_optional_int(raw.get("version")),
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def executor_pod_template_conf(environ: Mapping[str, str], folder: str) -> dict[str, str]:
    """The Spark settings that build executors from the pod template the operator injected
    (EXECUTOR_POD_TEMPLATE), after writing it to a new file in ``folder``; none without it.
    Spark reads the template from a file only (spark.kubernetes.executor.podTemplateFile)."""
    raw = environ.get(EXECUTOR_POD_TEMPLATE)
    if not raw:
        return {}
    try:
        template = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ContractError(f"{EXECUTOR_POD_TEMPLATE} is not valid JSON: {error}") from None
    if not isinstance(template, dict) or template.get("kind") != "Pod":
        raise ContractError(f"{EXECUTOR_POD_TEMPLATE} must be the JSON of a Pod")
    handle, path = tempfile.mkstemp(prefix="executor-pod-template-", suffix=".json", dir=folder)
    with os.fdopen(handle, "w") as file:
        json.dump(template, file)
    return {"spark.kubernetes.executor.podTemplateFile": path,
            "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER}


# ---- what may leave a pod ------------------------------------------------------------------

REDACTED = "[redacted]"
_NAME = r"[\w.-]{0,40}"
_SECRET_WORDS = r"(?:password|passwd|pwd|secret|token|credential|access[_.-]?key|api[_.-]?key|private[_.-]?key)"
_CREDENTIALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL),
     REDACTED),
    # scheme://user:password@host
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]{0,20}://[^/\s:@]{0,100}):[^/\s@]{1,200}@"), rf"\1:{REDACTED}@"),
    (re.compile(r"(\bbearer\s+)[A-Za-z0-9._~+/-]+=*", re.IGNORECASE), rf"\1{REDACTED}"),
    # JSON Web Tokens, such as Kubernetes service account tokens.
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), REDACTED),
    # Kafka's JAAS configuration (sasl.jaas.config=...LoginModule required username="u"
    # password="p";), whole: it is a credential however it is quoted.
    (re.compile(rf"(\bsasl[._]jaas[._]config[\"']?\s*[=:]\s*+)(?!{re.escape(REDACTED)})[^;\n]*;?", re.IGNORECASE),
     rf"\1{REDACTED}"),
    # password="a quoted value, spaces and all"
    (re.compile(rf"(\b{_NAME}{_SECRET_WORDS}{_NAME}\s*[=:]\s*)\"(?:[^\"\\\n]|\\.)*\"", re.IGNORECASE),
     rf'\1"{REDACTED}"'),
    # password=..., "secret": "...", AWS_SECRET_ACCESS_KEY=..., api-key: ...
    (re.compile(rf"(\b{_NAME}{_SECRET_WORDS}{_NAME}[\"']?\s*[=:]\s*[\"']?)(?!{re.escape(REDACTED)})[^\s\"',;&}}]+",
                re.IGNORECASE),
     rf"\1{REDACTED}"),
    # AWS access key ids: long-term (AKIA...) and temporary (ASIA...) ones.
    (re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[A-Z0-9]{16}\b"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"), REDACTED),
)
# An AWS secret access key on its own: 40 characters of base64. Hex digests (git commits,
# hashes) are 40 characters too, but of one letter case only.
_FORTY = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")


def scrub_credentials(text: str) -> str:
    """``text`` with what looks like a credential replaced by REDACTED: AWS access key ids
    and secret keys, bearer tokens and JWTs, passwords in URLs, ``password=...``-style
    pairs, private keys. For what leaves a driver pod as words (its termination message,
    its log's tail in the operator's status and Events); a heuristic, so it errs on the
    side of redacting."""
    for pattern, replacement in _CREDENTIALS:
        text = pattern.sub(replacement, text)
    return _FORTY.sub(_secret_key, text)


def _secret_key(found: re.Match[str]) -> str:
    value = found.group(0)
    mixed = any(c.islower() for c in value) and any(c.isupper() for c in value) and any(c.isdigit() for c in value)
    return REDACTED if mixed else value
