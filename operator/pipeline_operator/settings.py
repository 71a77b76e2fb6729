"""The operator's own settings, loaded once at start from flags and environment variables
(``PIPELINE_OPERATOR_<FIELD>``; flags win). See ``python -m pipeline_operator --help``."""

from __future__ import annotations

import argparse
import ast
import inspect
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from pipeline_operator.lifecycle import Tunables

ENV_PREFIX = "PIPELINE_OPERATOR_"


@dataclass(frozen=True)
class Settings:
    namespaces: tuple[str, ...] = ()
    """Namespaces to serve; empty serves all namespaces (needs cluster-wide RBAC)."""
    peering: str = ""
    """kopf peering name for running several replicas (one is active); empty runs standalone.
    The peering CRDs (crds/kopf-peering.yaml) must be installed."""
    priority: int = 0
    """kopf peering priority of this replica; the highest active one serves."""
    liveness_host: str = "0.0.0.0"
    liveness_port: int = 8080
    """Port of kopf's liveness endpoint (/healthz). Pods share the host network on the local
    cluster, so every replica needs its own."""
    metrics_port: int = 9090
    """Port of the Prometheus metrics endpoint (/metrics); 0 disables it."""
    kubeconfig: str = ""
    """A kubeconfig file; empty uses the in-cluster service account (or $KUBECONFIG)."""
    resync_seconds: float = 10.0
    """How often each pipeline is looked at when nothing happens (health, checkpoint age)."""
    poll_seconds: float = 2.0
    """How often a pipeline waiting for a pod to go is looked at (pod events also wake it)."""
    recheck_seconds: float = 30.0
    """How often an invalid pipeline's prerequisites (Secret, claim) are looked up again."""
    report_stale_after_seconds: float = 60.0
    """A driver whose report is older than this while it has work to do is Degraded (it
    reports every ~5 s while anything changes)."""
    checkpoint_refresh_seconds: float = 5.0
    """The status's checkpoint follows a busy driver's commits at most this often."""
    api_threads: int = 8
    """Threads making blocking API calls for all pipelines together."""
    allow_privileged_pod_templates: bool = False
    """Let pod templates and sparkConf ask for host access and privileges (hostPath,
    privileged, host namespaces and ports, added capabilities, root); another service
    account and plain AWS keys stay refused. The chart sets it from
    admission.allowPrivilegedPodTemplates, which relaxes its admission policy alike."""
    log_format: str = "plain"
    """plain, full or json (kopf's log formats)."""
    verbose: bool = False

    def tunables(self) -> Tunables:
        return Tunables(resync_seconds=self.resync_seconds, poll_seconds=self.poll_seconds,
                        recheck_seconds=self.recheck_seconds,
                        report_stale_after_seconds=self.report_stale_after_seconds,
                        checkpoint_refresh_seconds=self.checkpoint_refresh_seconds)

    @property
    def liveness_endpoint(self) -> str:
        return f"http://{self.liveness_host}:{self.liveness_port}/healthz"


def load(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="python -m pipeline_operator",
                                     description="The PersistentPipeline operator (kopf).")
    defaults, docs = Settings(), field_docs(Settings)
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        env_value = environ.get(ENV_PREFIX + f.name.upper())
        default = getattr(defaults, f.name)
        doc = docs.get(f.name, "")
        if f.name == "namespaces":
            env_list = tuple(n for n in (env_value or "").split(",") if n)
            parser.add_argument("--namespace", "-n", dest="namespaces", action="append",
                                default=None, help="a namespace to serve (repeatable); default: all")
            parser.set_defaults(namespaces=None, _env_namespaces=env_list)
        elif isinstance(default, bool):
            parser.add_argument(flag, action="store_true", default=_bool(env_value) if env_value else default,
                                help=doc)
        else:
            kind = type(default)
            parser.add_argument(flag, type=kind, default=kind(env_value) if env_value else default, help=doc)
    options = vars(parser.parse_args(argv))
    env_namespaces = options.pop("_env_namespaces")
    options["namespaces"] = tuple(options["namespaces"] or env_namespaces)
    return Settings(**options)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass: the flags' help is the settings' own doc."""
    body = ast.parse(inspect.getsource(cls)).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for node, after in zip(body.body, body.body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def _bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")
