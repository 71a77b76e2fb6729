"""The contract between the operator and the driver: which environment variables the
operator injects into a driver pod, and how the driver reads them.

Both sides import this module (the operator through ``spark_app.contract`` only, which
needs neither pyspark nor boto3), and tests/unit/test_contract.py checks that what the
operator's pod builder writes is what ``Config.from_env`` reads. Secrets never pass
through here: S3 credentials reach the driver as the standard AWS variables, which the
operator fills from a Secret with ``secretKeyRef``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

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
# Filled by the operator from the downward API; with both set, the driver reports its
# progress in an annotation on its own pod, which the operator watches.
POD_NAME = "SPARK_APP_POD_NAME"
POD_NAMESPACE = "SPARK_APP_POD_NAMESPACE"
EXECUTOR_POD_TEMPLATE = "SPARK_APP_EXECUTOR_POD_TEMPLATE"
"""Kubernetes execution only: the JSON of the Pod that Spark builds each executor from (its
restricted security context, scratch volumes, and the S3 credentials as secretKeyRef). The
driver writes it to a file and names it in spark.kubernetes.executor.podTemplateFile
(``executor_pod_template_conf``)."""
EXECUTOR_CONTAINER = "executor"
"""The container of EXECUTOR_POD_TEMPLATE that Spark turns into the executor's."""
STATUS_ANNOTATION = "sparkapp.dev/status"
"""JSON written by the driver on its pod every few seconds while it changes:
{"epoch": int, "reported_ms": int, "state": "starting"|"running"|"stopping",
 "stored_epoch": int (the epoch found in storage at start),
 "queries": {name: {"batch": int|null, "batch_time_ms": int|null, "commit_time_ms": int|null,
                    "offsets": {persistent_id: offset}, "backlog": bool, "active": bool,
                    "malformed": int, "iterate": object|null}}}"""

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
    POD_NAME,
    POD_NAMESPACE,
    EXECUTOR_POD_TEMPLATE,
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

TERMINATION_LOG = "/dev/termination-log"
"""Where a driver writes its final one-line message (Kubernetes' terminationMessagePath)."""


class ContractError(ValueError):
    """An injected variable is missing or malformed; the message names it."""


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
    """namespace/name of the PersistentPipeline, shown as the lease holder."""
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_path_style: bool = False
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    """Extra Spark configuration (spark.master, executor settings, ...)."""
    dead_letter_uri: str | None = None
    """Where malformed input rows go; defaults to beside the first output."""

    def to_env(self) -> dict[str, str]:
        env = {
            METADATA_URI: self.metadata_uri,
            SNAPSHOT_URI: self.snapshot_uri,
            SNAPSHOT_INTERVAL_MS: str(self.snapshot_interval_ms),
            PIPELINE: self.pipeline,
            S3_PATH_STYLE: "true" if self.s3_path_style else "false",
        }
        if self.epoch is not None:
            env[EPOCH] = str(self.epoch)
        if self.s3_endpoint:
            env[S3_ENDPOINT] = self.s3_endpoint
        if self.s3_region:
            env[S3_REGION] = self.s3_region
        if self.spark_conf:
            env[SPARK_CONF] = json.dumps(dict(self.spark_conf), sort_keys=True)
        if self.dead_letter_uri:
            env[DEAD_LETTER_URI] = self.dead_letter_uri
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
            snapshot_interval_ms=_positive_int(environ, SNAPSHOT_INTERVAL_MS, default=10_000),
            epoch=_positive_int(environ, EPOCH, default=None),
            pipeline=environ.get(PIPELINE, ""),
            s3_endpoint=environ.get(S3_ENDPOINT) or None,
            s3_region=environ.get(S3_REGION) or None,
            s3_path_style=environ.get(S3_PATH_STYLE, "false").lower() == "true",
            spark_conf=_json_object(environ, SPARK_CONF),
            dead_letter_uri=environ.get(DEAD_LETTER_URI) or None,
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
_CREDENTIALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL),
     REDACTED),
    # scheme://user:password@host
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]{0,20}://[^/\s:@]{0,100}):[^/\s@]{1,200}@"), rf"\1:{REDACTED}@"),
    (re.compile(r"(\bbearer\s+)[A-Za-z0-9._~+/-]+=*", re.IGNORECASE), rf"\1{REDACTED}"),
    # JSON Web Tokens, such as Kubernetes service account tokens.
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), REDACTED),
    # password=..., "secret": "...", AWS_SECRET_ACCESS_KEY=..., api-key: ...
    (re.compile(rf"(\b{_NAME}(?:password|passwd|pwd|secret|token|credential|access[_.-]?key|api[_.-]?key|"
                rf"private[_.-]?key){_NAME}[\"']?\s*[=:]\s*[\"']?)[^\s\"',;&}}]+", re.IGNORECASE),
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
