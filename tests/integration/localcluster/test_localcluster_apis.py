"""The control plane around the pods: nodes, RBAC for in-cluster clients, controllers, S3."""

from __future__ import annotations

import time
import uuid

import boto3
import pytest
from botocore.exceptions import ClientError
from kubernetes import client

from localcluster import ClusterInfo
from localcluster.kubectl import KubeCommands
from localcluster.testing import phase_in, shell_pod, wait_for

pytestmark = pytest.mark.cluster

LIST_PODS = """
import sys
from kubernetes import client, config
from kubernetes.client.rest import ApiException
config.load_incluster_config()
namespace = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
try:
    client.CoreV1Api().list_namespaced_pod(namespace)
except ApiException as e:
    print("status", e.status)
    sys.exit(3 if e.status == 403 else 4)
print("allowed")
"""


def test_kubectl_shows_the_node_ready(kube: KubeCommands) -> None:
    lines = kube.kubectl("get", "nodes", "--no-headers").split("\n")
    assert lines[0].split()[:2] == ["local-node", "Ready"]


def test_in_cluster_clients_are_subject_to_rbac(
    core: client.CoreV1Api, api_client: client.ApiClient, namespace: str
) -> None:
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader"))
    )
    wait_for(
        "the service account",
        lambda: core.list_namespaced_service_account(namespace, field_selector="metadata.name=reader").items,
    )

    def run(name: str) -> client.V1Pod:
        manifest = shell_pod(name, LIST_PODS, image="python:3.11")
        manifest["spec"]["serviceAccountName"] = "reader"
        core.create_namespaced_pod(namespace, manifest)
        return wait_for(
            f"{name} to finish", phase_in(core, namespace, name, "Succeeded", "Failed"), timeout=60
        )

    denied = run("denied")
    assert denied.status.container_statuses[0].state.terminated.exit_code == 3, "a 403 was expected"
    rbac = client.RbacAuthorizationV1Api(api_client)
    rule = client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])
    rbac.create_namespaced_role(
        namespace, client.V1Role(metadata=client.V1ObjectMeta(name="pod-reader"), rules=[rule])
    )
    binding = client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="reader-reads"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=namespace)],
    )
    rbac.create_namespaced_role_binding(namespace, binding)
    allowed = run("allowed")
    assert allowed.status.phase == "Succeeded"


def test_readiness_and_liveness_probes(core: client.CoreV1Api, namespace: str) -> None:
    manifest = shell_pod(
        "probed",
        "sleep 1; touch /work/ready; while true; do sleep 0.1; done",
        restart="Always",
        grace_seconds=1,
        volumes=[{"name": "work", "emptyDir": {}}],
        mounts=[{"name": "work", "mountPath": "/work"}],
        # exec probes run inside the container's mount namespace: /work is its emptyDir.
        readinessProbe={"exec": {"command": ["test", "-f", "/work/ready"]}, "periodSeconds": 1},
        livenessProbe={
            "exec": {"command": ["false"]},
            "periodSeconds": 1,
            "failureThreshold": 2,
            "initialDelaySeconds": 3,
        },
    )
    core.create_namespaced_pod(namespace, manifest)

    def ready() -> bool:
        conditions = core.read_namespaced_pod("probed", namespace).status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    def restarted() -> bool:
        return core.read_namespaced_pod("probed", namespace).status.container_statuses[0].restart_count >= 1

    assert not ready()
    wait_for("readiness", ready, timeout=15)
    wait_for("a liveness restart", restarted, timeout=20)


def test_deployments_get_pods_and_garbage_collection_removes_them(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    apps = client.AppsV1Api(api_client)
    labels = {"app": "sleeper"}
    template = shell_pod("ignored", "while true; do sleep 1; done")
    deployment = {
        "metadata": {"name": "sleeper"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": dict(template["spec"], restartPolicy="Always", terminationGracePeriodSeconds=1),
            },
        },
    }
    apps.create_namespaced_deployment(namespace, deployment)
    wait_for(
        "the deployment to be available",
        lambda: apps.read_namespaced_deployment("sleeper", namespace).status.available_replicas,
        timeout=30,
    )
    apps.delete_namespaced_deployment("sleeper", namespace, propagation_policy="Background")
    wait_for("its pods to be collected", lambda: not core.list_namespaced_pod(namespace).items, timeout=30)


def test_a_service_of_a_running_pod_raises_no_endpoint_warnings(core: client.CoreV1Api, namespace: str) -> None:
    # Every pod's IP is 127.0.0.1, which the API refuses in EndpointSlices; the endpoint
    # controllers are off, so nothing tries (Services route nothing on the local cluster).
    pod = shell_pod("web", "sleep 30")
    pod["metadata"]["labels"] = {"app": "web"}
    core.create_namespaced_pod(namespace, pod)
    core.create_namespaced_service(namespace, {"metadata": {"name": "web"}, "spec": {
        "clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 80}]}})
    wait_for("Running", phase_in(core, namespace, "web", "Running"))
    time.sleep(3)  # the controllers react within a second of the pod turning ready
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.kind=Service").items
    assert [e.reason for e in events if e.type == "Warning"] == []


@pytest.mark.s3
def test_s3_round_trip_with_put_if_absent(local_cluster: ClusterInfo) -> None:
    env = local_cluster.env()
    s3 = boto3.client(
        "s3",
        endpoint_url=local_cluster.s3_endpoint,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    bucket = f"lc-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="commits/0.json", Body=b'{"offset": 0}', IfNoneMatch="*")
    assert s3.get_object(Bucket=bucket, Key="commits/0.json")["Body"].read() == b'{"offset": 0}'
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=bucket, Key="commits/0.json", Body=b'{"offset": 1}', IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert s3.get_object(Bucket=bucket, Key="commits/0.json")["Body"].read() == b'{"offset": 0}'
