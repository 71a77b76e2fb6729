"""A container's environment, resolved as kubelet does. Pure: the Secrets and ConfigMaps it
refers to are fetched beforehand and passed in (`None` for one that does not exist).

Precedence, lowest first: the host variables we pass through, the image's ENV, the
service variables (KUBERNETES_SERVICE_HOST...), envFrom in order, env in order.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from typing import Any

JsonDict = dict[str, Any]
# ("Secret" | "ConfigMap", name) -> the object, or None when it does not exist.
ObjectKey = tuple[str, str]
Objects = Mapping[ObjectKey, JsonDict | None]

# A C identifier-ish name; kubelet skips envFrom keys that are not valid variable names.
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_REFERENCE = re.compile(r"\$\$|\$\(([^)]*)\)")


class ConfigError(Exception):
    """Kubelet's CreateContainerConfigError; the message is kubelet's wording."""


def referenced_objects(container: JsonDict) -> set[ObjectKey]:
    """The Secrets and ConfigMaps a container's env and envFrom read."""
    keys: set[ObjectKey] = set()
    for source in container.get("envFrom") or ():
        if "secretRef" in source:
            keys.add(("Secret", source["secretRef"]["name"]))
        if "configMapRef" in source:
            keys.add(("ConfigMap", source["configMapRef"]["name"]))
    for var in container.get("env") or ():
        value_from = var.get("valueFrom") or {}
        if "secretKeyRef" in value_from:
            keys.add(("Secret", value_from["secretKeyRef"]["name"]))
        if "configMapKeyRef" in value_from:
            keys.add(("ConfigMap", value_from["configMapKeyRef"]["name"]))
    return keys


def service_env(apiserver_host: str, apiserver_port: int) -> list[tuple[str, str]]:
    """What kubelet injects for the `kubernetes` Service, pointing at the real apiserver
    address: there is no Service routing here."""
    host, port = apiserver_host, str(apiserver_port)
    url = f"tcp://{host}:{port}"
    return [
        ("KUBERNETES_SERVICE_HOST", host),
        ("KUBERNETES_SERVICE_PORT", port),
        ("KUBERNETES_SERVICE_PORT_HTTPS", port),
        ("KUBERNETES_PORT", url),
        ("KUBERNETES_PORT_443_TCP", url),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
        ("KUBERNETES_PORT_443_TCP_ADDR", host),
        ("KUBERNETES_PORT_443_TCP_PORT", port),
    ]


def resolve_env(
    container: JsonDict,
    pod: JsonDict,
    objects: Objects,
    base: Sequence[tuple[str, str]] = (),
) -> dict[str, str]:
    """The container's final environment. Raises ConfigError like kubelet would."""
    env: dict[str, str] = dict(base)
    namespace = pod["metadata"]["namespace"]
    for source in container.get("envFrom") or ():
        env.update(_env_from(source, namespace, objects))
    for var in container.get("env") or ():
        value = _env_value(var, container, pod, objects, env)
        if value is not None:
            env[var["name"]] = value
    return env


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: unknown references stay as they are, $$ escapes $."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _REFERENCE.sub(replace, text)


def _env_from(source: JsonDict, namespace: str, objects: Objects) -> dict[str, str]:
    prefix = source.get("prefix", "")
    if "secretRef" in source:
        kind, ref = "Secret", source["secretRef"]
    else:
        kind, ref = "ConfigMap", source["configMapRef"]
    obj = objects.get((kind, ref["name"]))
    if obj is None:
        if ref.get("optional"):
            return {}
        raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
    data = object_data(kind, obj)
    return {prefix + k: v for k, v in data.items() if _ENV_NAME.match(prefix + k)}


def object_data(kind: str, obj: JsonDict) -> dict[str, str]:
    """A Secret's data decoded, or a ConfigMap's data (binaryData decoded as text)."""
    if kind == "Secret":
        return {k: base64.b64decode(v).decode(errors="replace") for k, v in (obj.get("data") or {}).items()}
    data = dict(obj.get("data") or {})
    for k, v in (obj.get("binaryData") or {}).items():
        data[k] = base64.b64decode(v).decode(errors="replace")
    return data


def _env_value(
    var: JsonDict, container: JsonDict, pod: JsonDict, objects: Objects, env: Mapping[str, str]
) -> str | None:
    if "valueFrom" not in var:
        return expand(str(var.get("value", "")), env)
    value_from = var["valueFrom"]
    namespace = pod["metadata"]["namespace"]
    if "secretKeyRef" in value_from:
        return _key_ref("Secret", value_from["secretKeyRef"], namespace, objects)
    if "configMapKeyRef" in value_from:
        return _key_ref("ConfigMap", value_from["configMapKeyRef"], namespace, objects)
    if "fieldRef" in value_from:
        return field_value(pod, value_from["fieldRef"]["fieldPath"])
    if "resourceFieldRef" in value_from:
        return resource_value(container, value_from["resourceFieldRef"])
    raise ConfigError(f"unsupported valueFrom in env var {var['name']}: {sorted(value_from)}")


def _key_ref(kind: str, ref: JsonDict, namespace: str, objects: Objects) -> str | None:
    obj = objects.get((kind, ref["name"]))
    if obj is None:
        if ref.get("optional"):
            return None
        raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
    data = object_data(kind, obj)
    if ref["key"] not in data:
        if ref.get("optional"):
            return None
        raise ConfigError(f"couldn't find key {ref['key']} in {kind} {namespace}/{ref['name']}")
    return data[ref["key"]]


def field_value(pod: JsonDict, field_path: str) -> str:
    """The downward API's fieldRef, for env and for downwardAPI volume files."""
    meta = pod["metadata"]
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    mapped = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", field_path)
    if mapped:
        return str((meta.get(mapped.group(1)) or {}).get(mapped.group(2), ""))
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "metadata.labels": _format_map(meta.get("labels") or {}),
        "metadata.annotations": _format_map(meta.get("annotations") or {}),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        # Every pod shares the host network: its IP is the loopback address.
        "status.podIP": status.get("podIP") or "127.0.0.1",
        "status.podIPs": status.get("podIP") or "127.0.0.1",
        "status.hostIP": status.get("hostIP") or "127.0.0.1",
        "status.hostIPs": status.get("hostIP") or "127.0.0.1",
    }
    if field_path not in simple:
        raise ConfigError(f"unsupported fieldPath {field_path!r}")
    return str(simple[field_path] or "")


def _format_map(values: Mapping[str, str]) -> str:
    return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))


# Node-wide defaults when a container sets no limit: kubelet reports node allocatable.
_DEFAULT_RESOURCES = {"cpu": "2", "memory": "8Gi", "ephemeral-storage": "100Gi"}
_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "m": 0.001,
}  # fmt: skip


def parse_quantity(quantity: str) -> float:
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * _SUFFIXES[suffix]
    return float(quantity)


def resource_value(container: JsonDict, ref: JsonDict) -> str:
    """resourceFieldRef: limits.cpu, requests.memory... rounded up in units of `divisor`."""
    kind, _, resource = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(resource) or (resources.get("limits") or {}).get(resource)
    amount = parse_quantity(str(value or _DEFAULT_RESOURCES.get(resource, "0")))
    divisor = parse_quantity(str(ref.get("divisor") or "1"))
    units = amount / divisor
    return str(max(1, int(-(-units // 1))) if units else 0)
