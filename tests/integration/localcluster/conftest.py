"""Fixtures of the local control plane's own tests: API clients and a fresh namespace per test."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from localcluster import ClusterInfo
from localcluster.kubectl import KubeCommands
from localcluster.testing import wait_for


@pytest.fixture(scope="session")
def api_client(local_cluster: ClusterInfo) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(local_cluster.kubeconfig))


@pytest.fixture(scope="session")
def kube(local_cluster: ClusterInfo) -> KubeCommands:
    """kubectl and helm against the local cluster."""
    return KubeCommands.for_repo(local_cluster.kubeconfig)


@pytest.fixture(scope="session")
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def namespace(core: client.CoreV1Api, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of its own, once its default ServiceAccount exists (pods need it)."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.removeprefix("test_").lower())[:20].strip("-")
    name = f"lc-{slug}-{uuid.uuid4().hex[:5]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for("the default service account", lambda: core.list_namespaced_service_account(name).items)
    yield name
    core.delete_namespace(name)
