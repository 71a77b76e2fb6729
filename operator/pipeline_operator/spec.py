"""A PersistentPipeline's spec as frozen dataclasses, and the checks a schema cannot make.

The CRD (crds/persistentpipelines.sparkapp.dev.yaml) rejects malformed specs and fills in
defaults. ``parse_spec`` repeats those defaults (tests/unit/operator/test_operator_crd.py keeps
the two in step) and checks again what an older or hand-edited CRD might let through (S3
without a bucket, an interval of zero), plus what no schema can see (reserved variable
names, credentials written in plain text). It never calls the API server: the Secrets and
claims a spec needs are listed by ``prerequisites`` for the caller to look up.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from pipeline_operator import podsecurity
from pipeline_operator.errors import InvalidSpec, Problem
from pipeline_operator.names import MAX_NAME_LENGTH, POD_IP_ENV, STATE_MOUNT_PATH
from spark_app import contract

DEFAULT_IMAGE = "ghcr.io/persistent-pipelines/spark-app:0.1.0"
DEGRADED_WINDOW_INTERVALS = 5
"""Without spec.persistence.degradedAfterSeconds, this many snapshot intervals without a
commit (while input waits) make a pipeline Degraded."""
MIN_DEGRADED_WINDOW_INTERVALS = 2
CLAIM_SCHEME = "pvc://"
RESERVED_ENV = frozenset(contract.ALL) | {POD_IP_ENV}
_SECRET_LOOKING_CONF = re.compile(r"(secret|password|session\.token|access\.key|credential)", re.IGNORECASE)
# Spark's own references to Secrets for its executors (NAME:KEY, or a mount path): no values.
_SECRET_REFERENCE_CONF = ("spark.kubernetes.executor.secretKeyRef.", "spark.kubernetes.executor.secrets.")
_NONCE = re.compile(r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|)$")


@dataclass(frozen=True)
class Backoff:
    initial_seconds: float = 10.0
    """Delay before the first relaunch after a failure (0 relaunches at once)."""
    max_seconds: float = 300.0
    """Cap of the delay; also the delay after a driver exits as misconfigured (exit 2)."""
    multiplier: float = 2.0
    jitter: float = 0.2
    """Each delay is spread by up to this fraction either way, so that pipelines that
    failed together do not relaunch together."""


@dataclass(frozen=True)
class RestartPolicy:
    type: str = "Always"
    """Always (a stream: relaunch even after a clean exit), OnFailure, or Never."""
    backoff: Backoff = field(default_factory=Backoff)
    max_failures: int = 10
    """The failure budget: consecutive failures tolerated before giving up (BackoffExhausted)."""
    reset_after_seconds: int = 600
    """A driver running this long clears the consecutive failure count."""


@dataclass(frozen=True)
class Application:
    file: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    dead_letter_uri: str | None = None
    max_files_per_trigger: int | None = None
    """The default bound of a file source's batch in files (None: the runtime's)."""
    max_bytes_per_trigger: int | None = None
    """The default bound of a file source's batch in bytes (None: the runtime's)."""


@dataclass(frozen=True)
class Driver:
    resources: Mapping[str, Any] = field(default_factory=dict)
    env: tuple[Mapping[str, Any], ...] = ()
    service_account_name: str | None = None
    termination_grace_period_seconds: int = 30
    pod_template: Mapping[str, Any] = field(default_factory=dict)
    startup_timeout_seconds: int = 600
    """A driver pod that is not running after this long (unschedulable, volume not mounting) is replaced."""
    stuck_after_seconds: int = 60
    """A driver stuck this long on an image pull or container configuration error is replaced."""


@dataclass(frozen=True)
class Executors:
    instances: int = 2
    cores: int = 1
    memory: str = "1g"


@dataclass(frozen=True)
class Execution:
    mode: str = "Local"
    """Local (Spark's local[N] master inside the driver pod) or Kubernetes (executor pods)."""
    local_threads: int = 2
    executors: Executors = field(default_factory=Executors)
    driver_port: int = 7078
    block_manager_port: int = 7079


@dataclass(frozen=True)
class FilesystemBackend:
    claim_name: str
    path: str
    """The state's folder inside the claim; default <namespace>/<name>."""


@dataclass(frozen=True)
class S3Credentials:
    secret_name: str
    access_key_id_key: str = contract.AWS_ACCESS_KEY_ID
    secret_access_key_key: str = contract.AWS_SECRET_ACCESS_KEY
    session_token_key: str | None = None


@dataclass(frozen=True)
class S3Backend:
    bucket: str
    prefix: str
    """Default <namespace>/<name>."""
    options: contract.S3Options = field(default_factory=contract.S3Options)
    """Endpoint, region, path-style addressing: the driver, its executors and the cleanup
    pod are given these, so that all of them reach S3 alike."""
    credentials: S3Credentials | None = None
    """None: the driver uses the default AWS chain (e.g. the pod's cloud identity)."""


@dataclass(frozen=True)
class KafkaCredentials:
    """A SASL username and password, from a Secret (only ever as secretKeyRef)."""

    secret_name: str
    username_key: str = "username"
    password_key: str = "password"


@dataclass(frozen=True)
class KafkaCa:
    """The PEM certificates that sign the brokers', from a Secret or a ConfigMap."""

    kind: str
    """Secret or ConfigMap."""
    name: str
    key: str = "ca.crt"


@dataclass(frozen=True)
class Kafka:
    """The Kafka cluster sa.io.kafka reaches when a pipeline names none itself."""

    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    credentials: KafkaCredentials | None = None
    ca: KafkaCa | None = None


@dataclass(frozen=True)
class Persistence:
    backend: FilesystemBackend | S3Backend
    snapshot_interval_seconds: int = 10
    degraded_after_seconds: int = 10 * DEGRADED_WINDOW_INTERVALS
    outage_budget_seconds: int = 900
    """How long a driver rides out unreachable storage before it exits (exit code 5)."""
    on_delete: str = "Retain"
    """Retain keeps the stored state when the resource is deleted; Delete removes it."""
    reset_nonce: str = ""
    """Changing it starts from empty state (at a new root below the base) and accepts a new base."""

    @property
    def base_uri(self) -> str:
        """This pipeline's root in its backend, before reset and generation suffixes:
        ``s3://bucket/prefix``, or ``pvc://claim/path`` (the claim is part of the identity:
        the same path in another claim is other state)."""
        if isinstance(self.backend, S3Backend):
            return f"s3://{self.backend.bucket}/{self.backend.prefix}"
        return f"{CLAIM_SCHEME}{self.backend.claim_name}/{self.backend.path}"


def uri_in_pod(root: str) -> str:
    """Where a state root is reached from inside a pod: S3 as it is, a claim's folder
    under the mount path."""
    if not root.startswith(CLAIM_SCHEME):
        return root
    _claim, _, path = root.removeprefix(CLAIM_SCHEME).partition("/")
    return f"{STATE_MOUNT_PATH}/{path}"


@dataclass(frozen=True)
class TableReference:
    """A shared table another pipeline publishes (spec.inputs[].table)."""

    namespace: str
    """The publisher's namespace (the reader's own when not given)."""
    pipeline: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pipeline}/{self.name}"


@dataclass(frozen=True)
class InputBackfill:
    """The backfill of a table source, as far as the resource steers it while it runs."""

    rows_per_second: int | None = None
    """None: unlimited; 0: paused (changes to the rows already read keep flowing)."""


@dataclass(frozen=True)
class Input:
    """One entry of spec.inputs: one of the pipeline's inputs, named by the persistent id its
    code gives it, with what the operator resolves or steers for it."""

    persistent_id: str
    backfill: InputBackfill | None = None
    """None: the pipeline's code decides (sa.io.delta.read(rows_per_second=...))."""
    table: TableReference | None = None
    """A shared table another pipeline publishes (sa.io.tables.read or lookup of it)."""


@dataclass(frozen=True)
class PublishedTable:
    """One entry of spec.tables: a shared table this pipeline publishes."""

    name: str
    readers: tuple[str, ...] = ()
    """Other namespaces whose pipelines may read it ("*": any); its own namespace always may."""
    max_hold_age_seconds: int | None = None
    """A reader's hold behind for longer than this is broken (None: never)."""

    def grants(self, namespace: str, own_namespace: str) -> bool:
        return namespace == own_namespace or "*" in self.readers or namespace in self.readers


@dataclass(frozen=True)
class PipelineSpec:
    namespace: str
    name: str
    persistence: Persistence
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    application: Application = field(default_factory=Application)
    driver: Driver = field(default_factory=Driver)
    execution: Execution = field(default_factory=Execution)
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    state: str = "running"
    restart_nonce: str = ""
    upgrade_mode: str = "last-state"
    inputs: tuple[Input, ...] = ()
    """The sources' settings: a backfill's rate changes in a running driver (left out of
    pod_hash: changing it restarts nothing; the operator rewrites the pod's live
    settings); a shared table's reference shapes the pod (its location is injected)."""
    tables: tuple[PublishedTable, ...] = ()
    kafka: Kafka | None = None

    @property
    def table_inputs(self) -> tuple[tuple[Input, TableReference], ...]:
        return tuple((i, i.table) for i in self.inputs if i.table is not None)

    @property
    def pipeline(self) -> str:
        return f"{self.namespace}/{self.name}"

    @cached_property
    def live_settings(self) -> contract.LiveSettings:
        """What the driver reads from its live settings file (spark_app.contract)."""
        return contract.LiveSettings({i.persistent_id: i.backfill.rows_per_second
                                      for i in self.inputs if i.backfill is not None})

    @cached_property
    def pod_hash(self) -> str:
        """A digest of everything that shapes the driver pod. A running driver whose hash
        differs from the spec's is restarted (an upgrade); restart policy, state, nonces
        and monitoring windows change nothing in the pod and are left out. Computed once
        per spec: a reconcile parses the spec once, and its decision (the comparison with
        the running driver, the stateless generation, the hash it records) and the pod it
        builds read the same value."""
        shaping: dict[str, Any] = {
            "image": self.image,
            "image_pull_policy": self.image_pull_policy,
            "application": asdict(self.application),
            "driver": {k: v for k, v in asdict(self.driver).items()
                       if k not in ("startup_timeout_seconds", "stuck_after_seconds")},
            "execution": asdict(self.execution),
            "backend": asdict(self.persistence.backend),
            "kafka": asdict(self.kafka) if self.kafka else None,
            "snapshot_interval_seconds": self.persistence.snapshot_interval_seconds,
        }
        # Only when set, so that a pipeline without shared tables keeps the hash it had.
        if self.table_inputs:
            shaping["inputs"] = [{"persistent_id": i.persistent_id, "table": asdict(ref)}
                                 for i, ref in self.table_inputs]
        if self.tables:
            shaping["tables"] = [{"name": t.name, "max_hold_age_seconds": t.max_hold_age_seconds}
                                 for t in self.tables]
        return shaping_digest(shaping)


def shaping_digest(shaping: Mapping[str, Any]) -> str:
    """The pod hash of what shapes a driver pod. Unset (None) settings are left out, so that
    an operator release that learns a new optional setting does not change the hash of the
    pipelines that do not use it, and so does not restart every running driver when it is
    installed. (A new setting must therefore default to None, not to a value.)"""
    digest = hashlib.sha256(json.dumps(_set_only(shaping), sort_keys=True, default=str).encode()).hexdigest()
    return digest[:16]


def _set_only(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _set_only(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_set_only(v) for v in value]
    return value


@dataclass(frozen=True)
class Prerequisite:
    """An object the driver pod needs that must exist before it is created."""

    kind: str
    """Secret, PersistentVolumeClaim or ServiceAccount."""
    name: str
    keys: tuple[str, ...] = ()
    """For a Secret, the keys the pod reads."""
    field: str = ""
    """The spec field that names it, for messages."""


def parse_spec(raw: Mapping[str, Any], *, namespace: str, name: str, allow_privileged: bool = False) -> PipelineSpec:
    """The spec of a PersistentPipeline, or ``InvalidSpec`` listing every problem found.
    ``allow_privileged`` lets pod templates ask for host access and privileges
    (pipeline_operator.podsecurity)."""
    problems: list[Problem] = []
    reader = _Reader(raw, problems)
    if len(name) > MAX_NAME_LENGTH:
        problems.append(Problem("metadata.name", f"must be at most {MAX_NAME_LENGTH} characters"))
    persistence = _persistence(reader.section("persistence"), namespace, name)
    spec = PipelineSpec(
        namespace=namespace,
        name=name,
        persistence=persistence,  # type: ignore[arg-type]
        image=reader.string("image", DEFAULT_IMAGE, required=True),
        image_pull_policy=reader.choice("imagePullPolicy", ("Always", "IfNotPresent", "Never"), "IfNotPresent"),
        application=_application(reader.section("application"), allow_privileged),
        driver=_driver(reader.section("driver"), allow_privileged),
        execution=_execution(reader.section("execution")),
        restart_policy=_restart_policy(reader.section("restartPolicy")),
        state=reader.choice("state", ("running", "suspended"), "running"),
        restart_nonce=reader.string("restartNonce", ""),
        upgrade_mode=reader.choice("upgradeMode", ("last-state", "stateless"), "last-state"),
        inputs=_inputs(reader, namespace),
        tables=_tables(reader),
        kafka=_kafka(reader.section("kafka")) if reader.has("kafka") else None,
    )
    if problems:
        raise InvalidSpec(problems)
    return spec


def prerequisites(spec: PipelineSpec) -> list[Prerequisite]:
    """What must exist before a driver pod is created, so that a missing one is reported
    on the pipeline (a condition and an Event) instead of as a pod stuck waiting."""
    needed: list[Prerequisite] = []
    backend = spec.persistence.backend
    if isinstance(backend, FilesystemBackend):
        needed.append(Prerequisite("PersistentVolumeClaim", backend.claim_name,
                                   field="spec.persistence.filesystem.claimName"))
    elif backend.credentials is not None:
        creds = backend.credentials
        keys = (creds.access_key_id_key, creds.secret_access_key_key) + (
            (creds.session_token_key,) if creds.session_token_key else ())
        needed.append(Prerequisite("Secret", creds.secret_name, keys, "spec.persistence.s3.credentialsSecret"))
    if spec.driver.service_account_name:
        needed.append(Prerequisite("ServiceAccount", spec.driver.service_account_name,
                                   field="spec.driver.serviceAccountName"))
    kafka = spec.kafka
    if kafka is not None and kafka.credentials is not None:
        sasl = kafka.credentials
        needed.append(Prerequisite("Secret", sasl.secret_name, (sasl.username_key, sasl.password_key),
                                   "spec.kafka.sasl.credentialsSecret"))
    if kafka is not None and kafka.ca is not None and kafka.ca.kind == "Secret":
        needed.append(Prerequisite("Secret", kafka.ca.name, (kafka.ca.key,), "spec.kafka.tls.caSecret"))
    return needed


# ---- section parsers -------------------------------------------------------------------


class _Reader:
    """Reads one section of the spec, recording problems under its path instead of raising."""

    def __init__(self, raw: Any, problems: list[Problem], path: str = "spec") -> None:
        self.raw: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        self.problems = problems
        self.path = path
        if raw is not None and not isinstance(raw, Mapping):
            self.problem("", "must be an object")

    def problem(self, key: str, reason: str) -> None:
        self.problems.append(Problem(f"{self.path}.{key}" if key else self.path, reason))

    def section(self, key: str) -> _Reader:
        return _Reader(self.raw.get(key), self.problems, f"{self.path}.{key}")

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def string(self, key: str, default: str, *, required: bool = False) -> str:
        value = self.raw.get(key, default)
        if not isinstance(value, str):
            self.problem(key, "must be a string")
            return default
        if required and not value:
            self.problem(key, "must not be empty")
        return str(value)

    def optional_string(self, key: str) -> str | None:
        value = self.raw.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            self.problem(key, "must be a string")
            return None
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.raw.get(key, default)
        if value not in allowed:
            self.problem(key, f"must be one of {', '.join(allowed)} (got {value!r})")
            return default
        return str(value)

    def number(self, key: str, default: float, *, minimum: float, maximum: float | None = None,
               integer: bool = True) -> Any:
        value = self.raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or (integer and value != int(value)):
            self.problem(key, "must be an integer" if integer else "must be a number")
            return default
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum:g} and {maximum:g}" if maximum is not None else f"at least {minimum:g}"
            self.problem(key, f"must be {bound} (got {value:g})")
            return default
        return int(value) if integer else float(value)

    def flag(self, key: str) -> bool | None:
        value = self.raw.get(key)
        if value is not None and not isinstance(value, bool):
            self.problem(key, "must be true or false")
            return None
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problem(key, "must be a list of strings")
            return ()
        return tuple(value)

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.raw.get(key, {})
        if not isinstance(value, Mapping):
            self.problem(key, "must be an object")
            return {}
        return dict(value)

    def nonce(self, key: str) -> str:
        value = self.string(key, "")
        if value and (len(value) > 63 or not _NONCE.match(value)):
            self.problem(key, "must be at most 63 lower-case letters, digits, '-', '.' or '_', "
                              "starting and ending with a letter or digit")
            return ""
        return value


def _application(r: _Reader, allow_privileged: bool) -> Application:
    file, module = r.optional_string("file"), r.optional_string("module")
    if (file is None) == (module is None):
        r.problem("", "set exactly one of file (a pipeline file in the image) and module")
    conf = {str(k): v for k, v in r.mapping("sparkConf").items()}
    for key, value in conf.items():
        if not isinstance(value, str):
            r.problem(f"sparkConf.{key}", "must be a string")
        elif _SECRET_LOOKING_CONF.search(key) and not key.startswith(_SECRET_REFERENCE_CONF):
            r.problem(f"sparkConf.{key}", "looks like a credential: put credentials in a Secret "
                                          "(spec.persistence.s3.credentialsSecret, an env secretKeyRef, or "
                                          "spark.kubernetes.executor.secretKeyRef.ENV=SECRET:KEY)")
    r.problems.extend(podsecurity.spark_conf_problems(conf, allow_privileged=allow_privileged))
    limits = r.section("sourceDefaults")
    return Application(file=file, module=module, args=r.strings("args"), spark_conf=conf,
                       dead_letter_uri=r.optional_string("deadLetterUri"),
                       max_files_per_trigger=limits.number("maxFilesPerTrigger", 1, minimum=1)
                       if limits.has("maxFilesPerTrigger") else None,
                       max_bytes_per_trigger=_bytes(limits, "maxBytesPerTrigger"))


def _bytes(r: _Reader, key: str) -> int | None:
    """A byte count given as a number or a quantity (Ki, Mi, Gi)."""
    value = r.raw.get(key)
    if value is None:
        return None
    match = _QUANTITY.match(str(value))
    if isinstance(value, bool) or not match or int(match.group(1)) < 1:
        r.problem(key, f"must be a positive number of bytes or a quantity such as 128Mi (got {value!r})")
        return None
    return int(match.group(1)) * {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}[match.group(2)]


def _driver(r: _Reader, allow_privileged: bool) -> Driver:
    env = r.raw.get("env", [])
    if not isinstance(env, list) or not all(isinstance(e, Mapping) and isinstance(e.get("name"), str)
                                            for e in env):
        r.problem("env", "must be a list of environment variables, each with a name")
        env = []
    for i, var in enumerate(env):
        if var["name"] in RESERVED_ENV:
            r.problem(f"env[{i}].name", f"{var['name']} is set by the operator")
        elif var["name"] in podsecurity.CREDENTIAL_ENV and "value" in var:
            r.problem(f"env[{var['name']}].value", podsecurity.credential_message(var["name"]))
    template = r.mapping("podTemplate")
    r.problems.extend(podsecurity.template_problems(template, allow_privileged=allow_privileged))
    return Driver(
        resources=r.mapping("resources"),
        env=tuple(dict(e) for e in env),
        service_account_name=r.optional_string("serviceAccountName"),
        termination_grace_period_seconds=r.number("terminationGracePeriodSeconds", 30, minimum=1),
        pod_template=template,
        startup_timeout_seconds=r.number("startupTimeoutSeconds", 600, minimum=10),
        stuck_after_seconds=r.number("stuckAfterSeconds", 60, minimum=0),
    )


def _execution(r: _Reader) -> Execution:
    executors = r.section("executors")
    return Execution(
        mode=r.choice("mode", ("Local", "Kubernetes"), "Local"),
        local_threads=r.number("localThreads", 2, minimum=1),
        executors=Executors(
            instances=executors.number("instances", 2, minimum=1),
            cores=executors.number("cores", 1, minimum=1),
            memory=executors.string("memory", "1g", required=True),
        ),
        driver_port=r.number("driverPort", 7078, minimum=1024, maximum=65535),
        block_manager_port=r.number("blockManagerPort", 7079, minimum=1024, maximum=65535),
    )


def _restart_policy(r: _Reader) -> RestartPolicy:
    b = r.section("backoff")
    backoff = Backoff(
        initial_seconds=b.number("initialSeconds", 10, minimum=0, integer=False),
        max_seconds=b.number("maxSeconds", 300, minimum=0, integer=False),
        multiplier=b.number("multiplier", 2, minimum=1, integer=False),
        jitter=b.number("jitter", 0.2, minimum=0, maximum=1, integer=False),
    )
    if backoff.max_seconds < backoff.initial_seconds:
        b.problem("maxSeconds", f"must be at least initialSeconds ({backoff.initial_seconds:g})")
    return RestartPolicy(
        type=r.choice("type", ("Always", "OnFailure", "Never"), "Always"),
        backoff=backoff,
        max_failures=r.number("maxFailures", 10, minimum=0),
        reset_after_seconds=r.number("resetAfterSeconds", 600, minimum=1),
    )


def _persistence(r: _Reader, namespace: str, name: str) -> Persistence | None:
    if not r.raw:
        r.problem("", "is required: say where the state lives (filesystem or s3)")
        return None
    backend: FilesystemBackend | S3Backend | None = None
    if r.has("filesystem") == r.has("s3"):
        r.problem("", "set exactly one backend: filesystem or s3")
    elif r.has("filesystem"):
        fs = r.section("filesystem")
        backend = FilesystemBackend(claim_name=fs.string("claimName", "", required=True),
                                    path=_relative_path(fs, "path", f"{namespace}/{name}"))
    else:
        s3 = r.section("s3")
        bucket = s3.string("bucket", "", required=True)
        creds = s3.section("credentialsSecret")
        backend = S3Backend(
            bucket=bucket,
            prefix=_relative_path(s3, "prefix", f"{namespace}/{name}"),
            options=contract.S3Options(endpoint=s3.optional_string("endpoint"), region=s3.optional_string("region"),
                                       path_style=s3.flag("pathStyle")),
            credentials=S3Credentials(
                secret_name=creds.string("name", "", required=True),
                access_key_id_key=creds.string("accessKeyIdKey", contract.AWS_ACCESS_KEY_ID, required=True),
                secret_access_key_key=creds.string("secretAccessKeyKey", contract.AWS_SECRET_ACCESS_KEY,
                                                   required=True),
                session_token_key=creds.optional_string("sessionTokenKey"),
            ) if s3.has("credentialsSecret") else None,
        )
    interval = r.number("snapshotIntervalSeconds", 10, minimum=1)
    outage_budget = r.number("outageBudgetSeconds", 900, minimum=10)
    window = r.number("degradedAfterSeconds", interval * DEGRADED_WINDOW_INTERVALS, minimum=1)
    if window < MIN_DEGRADED_WINDOW_INTERVALS * interval:
        # Unlike FLINK-34131, where a window shorter than the interval flapped forever.
        r.problem("degradedAfterSeconds", f"must be at least {MIN_DEGRADED_WINDOW_INTERVALS} x "
                                          f"snapshotIntervalSeconds ({MIN_DEGRADED_WINDOW_INTERVALS * interval})")
    if backend is None:
        return None
    return Persistence(
        backend=backend,
        snapshot_interval_seconds=interval,
        degraded_after_seconds=window,
        outage_budget_seconds=outage_budget,
        on_delete=r.choice("onDelete", ("Retain", "Delete"), "Retain"),
        reset_nonce=r.nonce("resetNonce"),
    )


_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_PERSISTENT_ID = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _entries(r: _Reader, key: str) -> list[_Reader]:
    value = r.raw.get(key, [])
    if not isinstance(value, list):
        r.problem(key, "must be a list of objects")
        return []
    return [_Reader(item, r.problems, f"{r.path}.{key}[{n}]") for n, item in enumerate(value)]


def _inputs(r: _Reader, namespace: str) -> tuple[Input, ...]:
    inputs: list[Input] = []
    for entry in _entries(r, "inputs"):
        pid = entry.string("persistentId", "", required=True)
        if pid and not _PERSISTENT_ID.match(pid):
            entry.problem("persistentId", "may use only letters, digits, '_', '.', '-' (as the pipeline's code "
                                          "names the input: persistent_id=...)")
        if pid and any(i.persistent_id == pid for i in inputs):
            entry.problem("persistentId", f"{pid!r} is listed twice")
        backfill = None
        if entry.has("backfill"):
            section = entry.section("backfill")
            rate = section.raw.get("rowsPerSecond")
            backfill = InputBackfill(None if rate is None else section.number("rowsPerSecond", 0, minimum=0))
        table = None
        if entry.has("table"):
            t = entry.section("table")
            table = TableReference(namespace=t.string("namespace", namespace) or namespace,
                                   pipeline=t.string("pipeline", "", required=True),
                                   name=t.string("name", "", required=True))
            if table.pipeline and not _K8S_NAME.match(table.pipeline):
                t.problem("pipeline", "must be the name of a PersistentPipeline")
            if table.name and not _TABLE_NAME.match(table.name):
                t.problem("name", "must be a table name: letters, digits, '_', '.', '-'")
        inputs.append(Input(pid, backfill, table))
    return tuple(inputs)


def _tables(r: _Reader) -> tuple[PublishedTable, ...]:
    tables: list[PublishedTable] = []
    for entry in _entries(r, "tables"):
        name = entry.string("name", "", required=True)
        if name and not _TABLE_NAME.match(name):
            entry.problem("name", "must be a table name: letters, digits, '_', '.', '-' (as the pipeline's code "
                                  "publishes it: sa.io.tables.publish(..., name=...))")
        if name and any(t.name == name for t in tables):
            entry.problem("name", f"{name!r} is listed twice")
        age = entry.number("maxHoldAgeSeconds", 0, minimum=60) if entry.has("maxHoldAgeSeconds") else None
        tables.append(PublishedTable(name, entry.strings("readers"), age or None))
    return tuple(tables)


_BOOTSTRAP = re.compile(r"^[^,\s:]+:[0-9]{1,5}(,[^,\s:]+:[0-9]{1,5})*$")


def _kafka(r: _Reader) -> Kafka:
    servers = r.string("bootstrapServers", "", required=True)
    if servers and not _BOOTSTRAP.match(servers):
        r.problem("bootstrapServers", f"must be host:port[,host:port...] (got {servers!r})")
    protocol = r.choice("securityProtocol", contract.KAFKA_SECURITY_PROTOCOLS, "PLAINTEXT")
    sasl, tls = r.section("sasl"), r.section("tls")
    mechanism: str | None = None
    credentials: KafkaCredentials | None = None
    if protocol.startswith("SASL_") != r.has("sasl"):
        r.problem("sasl", f"is needed with securityProtocol {protocol}" if protocol.startswith("SASL_") else
                  f"needs securityProtocol SASL_PLAINTEXT or SASL_SSL (got {protocol})")
    elif r.has("sasl"):
        mechanism = sasl.choice("mechanism", contract.KAFKA_SASL_MECHANISMS, "SCRAM-SHA-512")
        creds = sasl.section("credentialsSecret")
        credentials = KafkaCredentials(secret_name=creds.string("name", "", required=True),
                                       username_key=creds.string("usernameKey", "username", required=True),
                                       password_key=creds.string("passwordKey", "password", required=True))
    ca: KafkaCa | None = None
    if r.has("tls"):
        if protocol not in ("SSL", "SASL_SSL"):
            r.problem("tls", f"needs securityProtocol SSL or SASL_SSL (got {protocol})")
        if tls.has("caSecret") == tls.has("caConfigMap"):
            tls.problem("", "set exactly one of caSecret and caConfigMap")
        else:
            kind, field_name = ("Secret", "caSecret") if tls.has("caSecret") else ("ConfigMap", "caConfigMap")
            source = tls.section(field_name)
            ca = KafkaCa(kind, source.string("name", "", required=True), source.string("key", "ca.crt", required=True))
    return Kafka(bootstrap_servers=servers, security_protocol=protocol, sasl_mechanism=mechanism,
                 credentials=credentials, ca=ca)


def _relative_path(r: _Reader, key: str, default: str) -> str:
    value = r.string(key, default).strip("/")
    if not value:
        r.problem(key, "must not be empty or '/': the state needs a folder of its own")
    elif any(part in ("", ".", "..") for part in value.split("/")):
        r.problem(key, "must be a relative path without '.', '..' or empty parts")
    return value
