"""Environment resolution: precedence, references, kubelet's errors."""

import base64

import pytest

from localcluster.kubelet.envvars import (
    ConfigError,
    expand,
    field_value,
    referenced_objects,
    resolve_env,
    resource_value,
    service_env,
)

POD = {
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"b": "2", "a": "1"},
        "annotations": {},
    },
    "spec": {"nodeName": "local-node", "serviceAccountName": "runner"},
    "status": {},
}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


SECRET = {"data": {"password": b64("s3cr3t"), "user": b64("alice")}}
CONFIG = {"data": {"MODE": "fast", "not a var": "x"}}
OBJECTS = {("Secret", "creds"): SECRET, ("ConfigMap", "settings"): CONFIG, ("Secret", "missing"): None}


def test_env_and_env_from_with_kubernetes_precedence() -> None:
    container = {
        "envFrom": [
            {"configMapRef": {"name": "settings"}},
            {"secretRef": {"name": "creds"}, "prefix": "DB_"},
        ],
        "env": [
            {"name": "MODE", "value": "slow"},
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {"name": "URL", "value": "postgres://$(DB_user)@db/$(MODE)?x=$$(KEEP)&y=$(UNKNOWN)"},
        ],
    }
    env = resolve_env(container, POD, OBJECTS, base=[("PATH", "/bin"), ("MODE", "base")])
    assert env["PATH"] == "/bin"
    assert env["MODE"] == "slow"
    assert env["DB_password"] == "s3cr3t"
    assert env["PASSWORD"] == "s3cr3t"
    assert env["URL"] == "postgres://alice@db/slow?x=$(KEEP)&y=$(UNKNOWN)"
    assert "not a var" not in env


def test_a_missing_secret_is_a_config_error_in_kubelets_words() -> None:
    container = {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "missing", "key": "k"}}}]}
    with pytest.raises(ConfigError, match='secret "missing" not found'):
        resolve_env(container, POD, OBJECTS)


def test_a_missing_key_is_a_config_error_unless_optional() -> None:
    ref = {"name": "creds", "key": "token"}
    container = {"env": [{"name": "X", "valueFrom": {"secretKeyRef": ref}}]}
    with pytest.raises(ConfigError, match="couldn't find key token in Secret ns/creds"):
        resolve_env(container, POD, OBJECTS)
    optional = {"env": [{"name": "X", "valueFrom": {"secretKeyRef": dict(ref, optional=True)}}]}
    assert "X" not in resolve_env(optional, POD, OBJECTS)


def test_the_error_message_never_holds_a_secret_value() -> None:
    container = {
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "nope"}}}]
    }
    with pytest.raises(ConfigError) as error:
        resolve_env(container, POD, OBJECTS)
    assert "s3cr3t" not in str(error.value)


def test_missing_optional_env_from_is_skipped() -> None:
    container = {"envFrom": [{"secretRef": {"name": "missing", "optional": True}}]}
    assert resolve_env(container, POD, OBJECTS) == {}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "p"),
        ("metadata.namespace", "ns"),
        ("metadata.uid", "u-1"),
        ("metadata.labels['a']", "1"),
        ("metadata.labels", 'a="1"\nb="2"'),
        ("spec.nodeName", "local-node"),
        ("spec.serviceAccountName", "runner"),
        ("status.podIP", "127.0.0.1"),
    ],
)
def test_field_refs(path: str, value: str) -> None:
    assert field_value(POD, path) == value


def test_resource_field_ref_rounds_up_in_divisor_units() -> None:
    container = {"resources": {"limits": {"memory": "1536Mi", "cpu": "500m"}}}
    assert resource_value(container, {"resource": "limits.memory", "divisor": "1Gi"}) == "2"
    assert resource_value(container, {"resource": "limits.cpu"}) == "1"
    assert resource_value(container, {"resource": "requests.memory", "divisor": "1Mi"}) == "1536"


def test_referenced_objects() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "a"}}],
        "env": [
            {"name": "X", "valueFrom": {"secretKeyRef": {"name": "b", "key": "k"}}},
            {"name": "Y", "value": "1"},
        ],
    }
    assert referenced_objects(container) == {("ConfigMap", "a"), ("Secret", "b")}


def test_service_env_points_at_the_apiserver() -> None:
    env = dict(service_env("127.0.0.1", 6443))
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == "6443"


def test_expand_leaves_unknown_references() -> None:
    assert expand("$(A)-$(B)-$$(A)", {"A": "1"}) == "1-$(B)-$(A)"
