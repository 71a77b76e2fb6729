"""The operator on the local control plane: the CRDs applied, a namespace per test with a
driver service account and claims, and the operator running as in production
(``python -m pipeline_operator``, a real kopf process) against the cluster's kubeconfig."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from ppl_cluster import (
    CRDS,
    DRIVER_RBAC,
    GROUP,
    PLURAL,
    PV_ROOT,
    RESTRICTED,
    VERSION,
    Namespace,
    Operator,
    claim,
)

from localcluster import ClusterInfo
from localcluster.testing import wait_for


@pytest.fixture(scope="session")
def cluster(local_cluster: ClusterInfo) -> ClusterInfo:
    """The local cluster with the CRDs of crds/ installed (replaced if they exist) and established."""
    extensions = client.ApiextensionsV1Api(config.new_client_from_config(config_file=str(local_cluster.kubeconfig)))
    for path in sorted(CRDS.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            _install(extensions, crd)

    def established() -> bool:
        crd = extensions.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_for("the PersistentPipeline CRD to be established", established)
    return local_cluster


def _install(extensions: client.ApiextensionsV1Api, crd: dict[str, Any]) -> None:
    """Creates or replaces ``crd``; parallel workers install the same one, so a conflict
    (another worker's write in between) or a create that lost the race is tried again."""
    for _ in range(5):
        try:
            current = extensions.read_custom_resource_definition(crd["metadata"]["name"])
            crd["metadata"]["resourceVersion"] = current.metadata.resource_version
            extensions.replace_custom_resource_definition(crd["metadata"]["name"], crd)
            return
        except client.ApiException as error:
            if error.status == 409:
                continue
            if error.status != 404:
                raise
        try:
            crd["metadata"].pop("resourceVersion", None)
            extensions.create_custom_resource_definition(crd)
            return
        except client.ApiException as error:
            if error.status != 409:
                raise
    raise RuntimeError(f"could not install the CRD {crd['metadata']['name']}: it kept changing under this worker")


@pytest.fixture(scope="session")
def api(cluster: ClusterInfo) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


@pytest.fixture
def ns(cluster: ClusterInfo, api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[Namespace]:
    """A fresh namespace with the driver's service account (allowed to report on its pod)
    and two claims: ``state`` for the pipeline's state, ``data`` for its input and output.
    It enforces Pod Security "restricted": the API server refuses any pod the operator or
    Spark would build that does not meet it."""
    slug = request.node.name.removeprefix("test_")[:18].replace("_", "-").strip("-").lower()
    name = f"ppl-{slug}-{uuid.uuid4().hex[:5]}"
    namespace = Namespace(name, cluster, api)
    namespace.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=RESTRICTED)))
    wait_for("the default service account", lambda: namespace.core.list_namespaced_service_account(name).items)
    namespace.apply(*DRIVER_RBAC, claim("state"), claim("data"))
    yield namespace
    # Pipelines first, while no operator holds their finalizers any more: drop them.
    for item in namespace.custom.list_namespaced_custom_object(GROUP, VERSION, name, PLURAL)["items"]:
        namespace.custom.patch_namespaced_custom_object(GROUP, VERSION, name, PLURAL, item["metadata"]["name"],
                                                        {"metadata": {"finalizers": None}})
    namespace.core.delete_namespace(name)
    shutil.rmtree(PV_ROOT / name, ignore_errors=True)  # the claims' folders on this machine


@pytest.fixture
def operator(ns: Namespace, tmp_path: Path) -> Iterator[Operator]:
    running = Operator(ns.cluster, ns.name, tmp_path)
    running.start()
    yield running
    running.stop()
