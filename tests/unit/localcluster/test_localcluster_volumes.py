"""Volume plans, mounts and the files kubelet would write."""

import base64
from pathlib import Path
from typing import Any

import pytest

from localcluster.kubelet.envvars import ConfigError
from localcluster.kubelet.volumes import (
    Mount,
    TokenSpec,
    VolumeError,
    object_refs,
    plan_mounts,
    plan_volumes,
    token_specs,
    volume_files,
    write_files,
)

POD_DIR = Path("/c/pods/u-1")
PV_DIR = Path("/c/pv")


def pod(volumes: list[dict[str, Any]], containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
        "spec": {"volumes": volumes, "containers": containers or [{"name": "main"}]},
    }


# What the ServiceAccount admission plugin adds to every pod.
KUBE_API_ACCESS = {
    "name": "kube-api-access-abcde",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    },
}


def test_where_each_kind_of_volume_lives() -> None:
    plans = plan_volumes(
        pod(
            [
                {"name": "scratch", "emptyDir": {}},
                {"name": "host", "hostPath": {"path": "/srv/data", "type": "DirectoryOrCreate"}},
                {"name": "state", "persistentVolumeClaim": {"claimName": "checkpoints"}},
                {"name": "conf", "configMap": {"name": "settings"}},
                KUBE_API_ACCESS,
            ]
        ),
        POD_DIR,
        PV_DIR,
    )
    assert plans["scratch"].path == "/c/pods/u-1/volumes/empty-dir/scratch"
    assert plans["host"].path == "/srv/data"
    assert plans["state"].path == "/c/pv/ns/checkpoints"
    assert plans["state"].claim == "checkpoints"
    assert plans["conf"].path == "/c/pods/u-1/volumes/configmap/conf"
    assert plans["kube-api-access-abcde"].path == "/c/pods/u-1/volumes/projected/kube-api-access-abcde"


def test_unsupported_volume_types_are_refused_with_their_name() -> None:
    with pytest.raises(VolumeError, match='volume "n": nfs volumes are not supported'):
        plan_volumes(pod([{"name": "n", "nfs": {"server": "x", "path": "/"}}]), POD_DIR, PV_DIR)


def test_mounts_sorted_parents_first_with_sub_paths_and_read_only() -> None:
    plans = plan_volumes(
        pod(
            [{"name": "data", "emptyDir": {}}, {"name": "conf", "configMap": {"name": "c"}}, KUBE_API_ACCESS]
        ),
        POD_DIR,
        PV_DIR,
    )
    container = {
        "name": "main",
        "volumeMounts": [
            {"name": "data", "mountPath": "/data/logs", "subPathExpr": "$(POD_NAME)"},
            {"name": "data", "mountPath": "/data/", "readOnly": True},
            {"name": "conf", "mountPath": "/etc/app.conf", "subPath": "app.conf"},
            {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ],
    }
    mounts = plan_mounts(container, plans, {"POD_NAME": "p"})
    empty = "/c/pods/u-1/volumes/empty-dir/data"
    assert mounts == [
        Mount(empty, "/data", True),
        Mount(empty + "/p", "/data/logs", False),
        Mount("/c/pods/u-1/volumes/configmap/conf/app.conf", "/etc/app.conf", True),
        Mount(
            "/c/pods/u-1/volumes/projected/kube-api-access-abcde",
            "/var/run/secrets/kubernetes.io/serviceaccount",
            True,
        ),
    ]


def test_a_sub_path_may_not_escape_its_volume() -> None:
    plans = plan_volumes(pod([{"name": "data", "emptyDir": {}}]), POD_DIR, PV_DIR)
    container = {
        "name": "main",
        "volumeMounts": [{"name": "data", "mountPath": "/x", "subPath": "../../etc"}],
    }
    with pytest.raises(ConfigError):
        plan_mounts(container, plans, {})


def test_the_service_account_volume_holds_token_ca_and_namespace() -> None:
    plans = plan_volumes(pod([KUBE_API_ACCESS]), POD_DIR, PV_DIR)
    plan = plans["kube-api-access-abcde"]
    assert object_refs(plan) == {("ConfigMap", "kube-root-ca.crt")}
    (spec,) = token_specs(plan)
    assert spec == TokenSpec(audience="", expiration_seconds=3607, path="token")
    objects = {("ConfigMap", "kube-root-ca.crt"): {"data": {"ca.crt": "PEM"}}}
    files = volume_files(plan, pod([KUBE_API_ACCESS]), objects, {spec: "jwt"})
    assert files == {"token": (b"jwt", 0o644), "ca.crt": (b"PEM", 0o644), "namespace": (b"ns", 0o644)}


def test_a_missing_root_ca_config_map_is_a_mount_failure() -> None:
    plan = plan_volumes(pod([KUBE_API_ACCESS]), POD_DIR, PV_DIR)["kube-api-access-abcde"]
    (spec,) = token_specs(plan)
    with pytest.raises(VolumeError, match='configmap "kube-root-ca.crt" not found'):
        volume_files(plan, pod([KUBE_API_ACCESS]), {("ConfigMap", "kube-root-ca.crt"): None}, {spec: "jwt"})


def test_secret_volume_items_and_modes() -> None:
    volume = {
        "name": "s",
        "secret": {
            "secretName": "creds",
            "defaultMode": 0o400,
            "items": [{"key": "k", "path": "dir/key", "mode": 0o600}],
        },
    }
    plan = plan_volumes(pod([volume]), POD_DIR, PV_DIR)["s"]
    secret = {"data": {"k": base64.b64encode(b"\x00bin").decode(), "other": ""}}
    assert volume_files(plan, pod([volume]), {("Secret", "creds"): secret}, {}) == {
        "dir/key": (b"\x00bin", 0o600)
    }
    with pytest.raises(VolumeError, match="non-existent config key: k"):
        volume_files(plan, pod([volume]), {("Secret", "creds"): {"data": {}}}, {})


def test_optional_missing_config_map_gives_an_empty_volume() -> None:
    volume = {"name": "c", "configMap": {"name": "nope", "optional": True}}
    plan = plan_volumes(pod([volume]), POD_DIR, PV_DIR)["c"]
    assert volume_files(plan, pod([volume]), {("ConfigMap", "nope"): None}, {}) == {}


def test_write_files_replaces_content_atomically(tmp_path: Path) -> None:
    write_files(tmp_path, {"token": (b"one", 0o644), "sub/ca.crt": (b"pem", 0o600)})
    write_files(tmp_path, {"token": (b"two", 0o644)})
    assert (tmp_path / "token").read_bytes() == b"two"
    assert (tmp_path / "sub" / "ca.crt").stat().st_mode & 0o777 == 0o600
    assert not [p for p in tmp_path.rglob(".tmp-*")]
