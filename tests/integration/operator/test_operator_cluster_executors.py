"""Spark-on-Kubernetes execution on the local control plane: the driver starts executor
pods that it owns (they mount the state claim to write the state stores), and a killed
driver takes its executors with it; the next epoch gets new ones and resumes."""

from __future__ import annotations

import pytest
from ppl_cluster import DRIVER_RBAC, Namespace, Operator, eventually, replay, wordcount, write_words

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

# Spark's own needs in client mode: manage its executor pods (and their configmaps).
EXECUTOR_RBAC = {
    **DRIVER_RBAC[1], "metadata": {"name": "spark-app-driver"},
    "rules": [{"apiGroups": [""], "resources": ["pods"],
               "verbs": ["get", "list", "watch", "create", "delete", "deletecollection", "patch"]},
              {"apiGroups": [""], "resources": ["services", "configmaps", "persistentvolumeclaims"],
               "verbs": ["get", "list", "watch", "create", "delete", "deletecollection"]}],
}


def executors(ns: Namespace) -> list[str]:
    pods = ns.core.list_namespaced_pod(ns.name, label_selector="sparkapp.dev/role=executor").items
    return [p.metadata.name for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def test_executors_are_pods_of_the_driver_and_a_relaunch_replaces_them(ns: Namespace, operator: Operator) -> None:
    ns.rbac.replace_namespaced_role("spark-app-driver", ns.name, EXECUTOR_RBAC)
    data = ns.folder("data")
    write_words(data, "a.csv", ["pear", "plum", "pear"])
    manifest = wordcount(execution={"mode": "Kubernetes", "executors": {"instances": 1, "cores": 1, "memory": "512m"}})
    manifest["spec"]["application"]["sparkConf"] = {  # executors read the input from the data claim too
        "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.options.claimName": "data",
        "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.mount.path": "/data"}
    ns.apply(manifest)

    first = eventually("an executor", lambda: executors(ns), timeout=180)
    owner = ns.core.read_namespaced_pod(first[0], ns.name).metadata.owner_references[0]
    assert (owner.kind, owner.name) == ("Pod", "wordcount-driver")
    eventually("a.csv counted", lambda: replay(data / "result.jsonlines") == {"pear": 2, "plum": 1}, timeout=300)
    assert "Running task" in ns.core.read_namespaced_pod_log(first[0], ns.name), "the executor ran no task"

    write_words(data, "b.csv", ["plum"])
    ns.kill_driver("wordcount")
    eventually("the executors gone with their driver", lambda: first[0] not in executors(ns), timeout=120)
    eventually("a new executor for epoch 2", lambda: ns.driver("wordcount", epoch=2) and
               [e for e in executors(ns) if e not in first], timeout=240)
    eventually("b.csv counted", lambda: replay(data / "result.jsonlines") == {"pear": 2, "plum": 2}, timeout=300)


def test_executors_get_the_s3_credentials_through_secret_references(ns: Namespace, operator: Operator) -> None:
    """Executors write the state stores into the checkpoint, which is in S3 here: they need
    the credentials the driver has, as references to the same Secret (never values)."""
    ns.rbac.replace_namespaced_role("spark-app-driver", ns.name, EXECUTOR_RBAC)
    s3, s3_spec = ns.s3_bucket_and_secret()
    bucket = s3_spec["bucket"]
    data = ns.folder("data")
    write_words(data, "a.csv", ["rye", "oat", "rye"])
    manifest = wordcount(execution={"mode": "Kubernetes", "executors": {"instances": 1, "cores": 1, "memory": "512m"}})
    manifest["spec"]["application"]["sparkConf"] = {
        "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.options.claimName": "data",
        "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.mount.path": "/data"}
    manifest["spec"]["persistence"] = {"snapshotIntervalSeconds": 5, "s3": s3_spec}
    ns.apply(manifest)

    executor = eventually("an executor", lambda: executors(ns), timeout=180)[0]
    env = {e.name: e for e in ns.core.read_namespaced_pod(executor, ns.name).spec.containers[0].env}
    assert env["AWS_SECRET_ACCESS_KEY"].value is None
    assert env["AWS_SECRET_ACCESS_KEY"].value_from.secret_key_ref.name == "s3-creds"
    eventually("a.csv counted", lambda: replay(data / "result.jsonlines") == {"rye": 2, "oat": 1}, timeout=300)
    stored = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"{ns.name}/wordcount/").get("Contents", [])]
    # The aggregation's state store, written by the executor's task into the S3 checkpoint.
    assert any("/state/" in key and key.endswith((".changelog", ".zip")) for key in stored), stored
