"""Settings: flags win over PIPELINE_OPERATOR_* variables, which win over defaults."""

from __future__ import annotations

import pytest
from pipeline_operator.settings import Settings, field_docs, load


def test_defaults_serve_all_namespaces_standalone() -> None:
    settings = load([], {})
    assert settings == Settings() and settings.namespaces == () and settings.peering == ""
    assert settings.liveness_endpoint == "http://0.0.0.0:8080/healthz"


def test_flags_and_environment() -> None:
    env = {"PIPELINE_OPERATOR_PEERING": "pipelines", "PIPELINE_OPERATOR_METRICS_PORT": "9100",
           "PIPELINE_OPERATOR_NAMESPACES": "a,b", "PIPELINE_OPERATOR_VERBOSE": "true"}
    settings = load(["--metrics-port", "9200", "--resync-seconds", "2.5"], env)
    assert (settings.peering, settings.metrics_port, settings.resync_seconds) == ("pipelines", 9200, 2.5)
    assert settings.namespaces == ("a", "b") and settings.verbose
    assert load(["-n", "x", "--namespace", "y"], env).namespaces == ("x", "y")
    assert settings.tunables().resync_seconds == 2.5


def test_every_setting_is_documented() -> None:
    docs = field_docs(Settings)
    undocumented = {f for f in Settings.__dataclass_fields__ if f not in docs}
    assert undocumented <= {"liveness_host", "verbose"}, undocumented


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Settings().peering = "x"  # type: ignore[misc]
