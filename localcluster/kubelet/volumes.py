"""Volumes as host folders, and the bind mounts that put them into a container. The plans and
file contents are pure functions of the pod and the objects it refers to; `write_files` is
the only function here that touches the disk.

Where a volume lives on the host:
  emptyDir                 .cache/cluster/pods/<uid>/volumes/empty-dir/<name>
  configMap, secret,       .cache/cluster/pods/<uid>/volumes/<kind>/<name>
  downwardAPI, projected
  hostPath                 the path itself
  persistentVolumeClaim    .cache/cluster/pv/<namespace>/<claim>  (survives the pod)
"""

from __future__ import annotations

import base64
import os
import posixpath
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster.kubelet.envvars import ConfigError, ObjectKey, Objects, expand, field_value, resource_value
from localcluster.kubelet.storage import claim_folder

JsonDict = dict[str, Any]

DEFAULT_MODE = 0o644
DEFAULT_TOKEN_SECONDS = 3600

# Files kubelet writes for these kinds; they are always mounted read-only.
_FILE_KINDS = ("configMap", "secret", "downwardAPI", "projected")
_SUPPORTED = ("emptyDir", "hostPath", "persistentVolumeClaim", *_FILE_KINDS)


class VolumeError(Exception):
    """A volume cannot be set up (yet); kubelet reports it as a FailedMount event."""


@dataclass(frozen=True)
class VolumePlan:
    name: str
    kind: str
    path: str
    """The folder (or, for some hostPaths, the file) that holds the volume on the host."""
    source: Mapping[str, Any]
    """The volume's source object from the pod spec (e.g. the `configMap` field)."""
    claim: str | None = None


@dataclass(frozen=True)
class Mount:
    """One bind mount inside the container's mount namespace."""

    source: str
    target: str
    read_only: bool


@dataclass(frozen=True)
class TokenSpec:
    """A projected serviceAccountToken source."""

    audience: str
    expiration_seconds: int
    path: str


def volume_kind(volume: JsonDict) -> str:
    kinds = [k for k in volume if k != "name"]
    return kinds[0] if kinds else "emptyDir"


def plan_volumes(pod: JsonDict, pod_dir: Path, pv_dir: Path) -> dict[str, VolumePlan]:
    namespace = pod["metadata"]["namespace"]
    plans: dict[str, VolumePlan] = {}
    for volume in pod["spec"].get("volumes") or ():
        name, kind = volume["name"], volume_kind(volume)
        source = volume.get(kind) or {}
        if kind not in _SUPPORTED:
            raise VolumeError(f'volume "{name}": {kind} volumes are not supported by the local cluster')
        if kind == "hostPath":
            path = source["path"]
        elif kind == "persistentVolumeClaim":
            claim = source["claimName"]
            plans[name] = VolumePlan(name, kind, str(claim_folder(pv_dir, namespace, claim)), source, claim)
            continue
        else:
            folder = "empty-dir" if kind == "emptyDir" else kind.lower()
            path = str(pod_dir / "volumes" / folder / name)
        plans[name] = VolumePlan(name, kind, path, source)
    return plans


def plan_mounts(
    container: JsonDict, volumes: Mapping[str, VolumePlan], env: Mapping[str, str]
) -> list[Mount]:
    """Bind mounts for a container, parents before children (as container runtimes sort them)."""
    mounts = []
    for volume_mount in container.get("volumeMounts") or ():
        plan = volumes.get(volume_mount["name"])
        if plan is None:
            raise ConfigError(f'volume "{volume_mount["name"]}" is mounted but not defined in the pod')
        sub_path = volume_mount.get("subPath") or expand(volume_mount.get("subPathExpr", ""), env)
        source = plan.path
        if sub_path:
            source = posixpath.join(plan.path, _checked_sub_path(sub_path))
        read_only = bool(volume_mount.get("readOnly")) or bool(plan.source.get("readOnly"))
        read_only = read_only or plan.kind in _FILE_KINDS
        mounts.append(Mount(source, posixpath.normpath(volume_mount["mountPath"]), read_only))
    return sorted(mounts, key=lambda m: m.target.count("/"))


def _checked_sub_path(sub_path: str) -> str:
    if posixpath.isabs(sub_path) or ".." in sub_path.split("/"):
        raise ConfigError(f"subPath {sub_path!r} must be a relative path without '..'")
    return sub_path


def object_refs(plan: VolumePlan) -> set[ObjectKey]:
    """The Secrets and ConfigMaps whose content the volume holds."""
    sources: Iterable[tuple[str, Mapping[str, Any]]] = [(plan.kind, plan.source)]
    if plan.kind == "projected":
        sources = [(kind, s[kind]) for s in plan.source.get("sources") or () for kind in s]
    refs = set()
    for kind, source in sources:
        if kind == "configMap":
            refs.add(("ConfigMap", source["name"]))
        elif kind == "secret":
            refs.add(("Secret", source.get("secretName") or source.get("name", "")))
    return refs


def token_specs(plan: VolumePlan) -> list[TokenSpec]:
    if plan.kind != "projected":
        return []
    specs = []
    for source in plan.source.get("sources") or ():
        token = source.get("serviceAccountToken")
        if token is not None:
            seconds = int(token.get("expirationSeconds") or DEFAULT_TOKEN_SECONDS)
            specs.append(TokenSpec(token.get("audience", ""), seconds, token["path"]))
    return specs


# Relative path in the volume -> (content, mode).
Files = dict[str, tuple[bytes, int]]


def volume_files(plan: VolumePlan, pod: JsonDict, objects: Objects, tokens: Mapping[TokenSpec, str]) -> Files:
    """The files a configMap, secret, downwardAPI or projected volume holds."""
    mode = int(plan.source.get("defaultMode", DEFAULT_MODE))
    namespace = pod["metadata"]["namespace"]
    if plan.kind == "configMap":
        return _object_files("ConfigMap", plan.source, plan.source["name"], namespace, objects, mode)
    if plan.kind == "secret":
        return _object_files("Secret", plan.source, plan.source["secretName"], namespace, objects, mode)
    if plan.kind == "downwardAPI":
        return _downward_files(plan.source.get("items") or (), pod, mode)
    if plan.kind == "projected":
        return _projected_files(plan, pod, objects, tokens, mode)
    return {}


def _projected_files(
    plan: VolumePlan, pod: JsonDict, objects: Objects, tokens: Mapping[TokenSpec, str], mode: int
) -> Files:
    namespace = pod["metadata"]["namespace"]
    files: Files = {}
    for source in plan.source.get("sources") or ():
        if "configMap" in source:
            ref = source["configMap"]
            files.update(_object_files("ConfigMap", ref, ref["name"], namespace, objects, mode))
        elif "secret" in source:
            ref = source["secret"]
            files.update(_object_files("Secret", ref, ref["name"], namespace, objects, mode))
        elif "downwardAPI" in source:
            files.update(_downward_files(source["downwardAPI"].get("items") or (), pod, mode))
        elif "serviceAccountToken" in source:
            spec = next(s for s in token_specs(plan) if s.path == source["serviceAccountToken"]["path"])
            files[spec.path] = (tokens[spec].encode(), mode)
        else:
            raise VolumeError(f'volume "{plan.name}": projected source {sorted(source)} is not supported')
    return files


def _object_files(
    kind: str, source: Mapping[str, Any], name: str, namespace: str, objects: Objects, mode: int
) -> Files:
    obj = objects.get((kind, name))
    if obj is None:
        if source.get("optional"):
            return {}
        raise VolumeError(f'{kind.lower()} "{name}" not found')
    data = _raw_data(kind, obj)
    items = source.get("items")
    if not items:
        return {key: (value, mode) for key, value in data.items()}
    files: Files = {}
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise VolumeError(f"{kind.lower()} references non-existent config key: {item['key']}")
        files[item["path"]] = (data[item["key"]], int(item.get("mode", mode)))
    return files


def _raw_data(kind: str, obj: JsonDict) -> dict[str, bytes]:
    if kind == "Secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _downward_files(items: Iterable[JsonDict], pod: JsonDict, mode: int) -> Files:
    files: Files = {}
    containers = {c["name"]: c for c in pod["spec"].get("containers") or ()}
    for item in items:
        if "fieldRef" in item:
            value = field_value(pod, item["fieldRef"]["fieldPath"])
        else:
            ref = item["resourceFieldRef"]
            value = resource_value(containers.get(ref.get("containerName", ""), {}), ref)
        files[item["path"]] = (value.encode(), int(item.get("mode", mode)))
    return files


def write_files(folder: Path, files: Files) -> None:
    """Writes each file atomically (temp file + rename), so a reader never sees half a token."""
    folder.mkdir(parents=True, exist_ok=True)
    for relative, (content, mode) in files.items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
