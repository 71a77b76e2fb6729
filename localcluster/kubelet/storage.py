"""Dynamic provisioning for PersistentVolumeClaims: the default StorageClass `local-path`
and a PersistentVolume per claim, pointing at the claim's host folder. Pure builders.

The node agent mounts a claim's folder whether or not it is bound; provisioning only makes
the API tell the truth (claims become Bound, as `helm --wait` and operators expect).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

JsonDict = dict[str, Any]

STORAGE_CLASS = "local-path"
PROVISIONER = "localcluster.io/host-folder"


def storage_class() -> JsonDict:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        # Retain: the folder outlives its claim, and a claim of the same name finds it again
        # (the agent deletes the PersistentVolume object itself with its claim).
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
    }


def needs_volume(claim: JsonDict) -> bool:
    spec = claim.get("spec", {})
    return (
        spec.get("storageClassName") == STORAGE_CLASS
        and not spec.get("volumeName")
        and not claim["metadata"].get("deletionTimestamp")
        and claim.get("status", {}).get("phase", "Pending") == "Pending"
    )


def claim_folder(pv_dir: Path, namespace: str, claim: str) -> Path:
    return pv_dir / namespace / claim


def is_orphan(volume: JsonDict, live_claim_uids: set[str]) -> bool:
    """A volume we provisioned whose claim no longer exists."""
    annotations = volume["metadata"].get("annotations") or {}
    claim_uid = (volume.get("spec", {}).get("claimRef") or {}).get("uid")
    return (
        annotations.get("pv.kubernetes.io/provisioned-by") == PROVISIONER and claim_uid not in live_claim_uids
    )


def volume_name(claim: JsonDict) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def volume_for(claim: JsonDict, pv_dir: Path) -> JsonDict:
    meta = claim["metadata"]
    spec = claim["spec"]
    storage = (spec.get("resources", {}).get("requests") or {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{meta['uid']}",
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": spec.get("volumeMode", "Filesystem"),
            "hostPath": {
                "path": str(claim_folder(pv_dir, meta["namespace"], meta["name"])),
                "type": "DirectoryOrCreate",
            },
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }
