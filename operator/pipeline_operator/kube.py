"""The one module that talks to the API server. Every read is a live GET, never a cache:
a driver is declared gone only when the API server itself says so (Kubeflow
spark-operator #2302 and #2755 relaunched drivers on a stale informer view).

Objects go in and come out as plain dicts (raw JSON, camelCase). API errors become the
operator's domain errors: ``Conflict`` (read again and retry) and ``ApiUnavailable``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from pipeline_operator import names
from pipeline_operator.errors import ApiUnavailable, Conflict, Refused
from pipeline_operator.spec import Prerequisite

JsonDict = dict[str, Any]
T = TypeVar("T")
_TIMEOUT = 15.0


class Kube:
    def __init__(self, api_client: client.ApiClient) -> None:
        self._configuration: client.Configuration = api_client.configuration
        # The generated client's signatures name its model classes, but it takes plain dicts
        # and, with _preload_content=False, returns the raw response: this module deals in
        # raw JSON throughout, so the API objects are typed as what they are used as.
        self._core: Any = client.CoreV1Api(api_client)
        self._custom: Any = client.CustomObjectsApi(api_client)

    @classmethod
    def connect(cls, kubeconfig: str = "", pool_size: int = 8) -> Kube:
        """From a kubeconfig file, else in-cluster, else $KUBECONFIG / ~/.kube/config."""
        configuration = client.Configuration()
        loaders: Any = config  # untyped functions of the kubernetes package
        if kubeconfig:
            loaders.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            try:
                loaders.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                loaders.load_kube_config(client_configuration=configuration)
        configuration.connection_pool_maxsize = pool_size
        return cls(client.ApiClient(configuration))

    def credentials(self) -> dict[str, Any]:
        """The connection this client uses, for kopf's own (a login handler passes it on).
        Asked again on every login, so an in-cluster token is re-read when it rotates."""
        c = self._configuration
        header = c.get_api_key_with_prefix("BearerToken") or c.get_api_key_with_prefix("authorization") or ""
        scheme, _, token = header.partition(" ") if " " in header else ("", "", header)
        return {"server": c.host, "ca_path": c.ssl_ca_cert, "insecure": not c.verify_ssl,
                "scheme": scheme or None, "token": token or None,
                "certificate_path": c.cert_file, "private_key_path": c.key_file}

    # ---- the PersistentPipeline ---------------------------------------------------------

    def get_pipeline(self, namespace: str, name: str) -> JsonDict | None:
        return _read(lambda: self._custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, names.PLURAL, name, _preload_content=False,
            _request_timeout=_TIMEOUT))

    def list_pipelines(self, namespace: str) -> list[JsonDict]:
        """Every PersistentPipeline the operator may see: all namespaces' with cluster-wide
        rights, else those of ``namespace`` (an operator serving listed namespaces)."""
        try:
            found = _call(lambda: self._custom.list_cluster_custom_object(
                names.GROUP, names.VERSION, names.PLURAL, _preload_content=False, _request_timeout=_TIMEOUT))
        except Refused as refused:
            if refused.status != 403:
                raise
            found = _call(lambda: self._custom.list_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace, names.PLURAL, _preload_content=False,
                _request_timeout=_TIMEOUT))
        return list(found.get("items") or [])

    def replace_status(self, resource: Mapping[str, Any], status: JsonDict) -> JsonDict:
        """Writes the whole status, conditional on the resourceVersion read: if anyone
        changed the resource since (a user, another replica), this raises ``Conflict``
        and nothing is acted on from the stale view."""
        meta = resource["metadata"]
        body = {"apiVersion": names.API_VERSION, "kind": names.KIND, "status": status,
                "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                             "resourceVersion": meta["resourceVersion"]}}
        return _call(lambda: self._custom.replace_namespaced_custom_object_status(
            names.GROUP, names.VERSION, meta["namespace"], names.PLURAL, meta["name"], body,
            _preload_content=False, _request_timeout=_TIMEOUT))

    # ---- pods and services ---------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> JsonDict | None:
        return _read(lambda: self._core.read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=_TIMEOUT))

    def create_pod(self, pod: JsonDict) -> JsonDict:
        """Raises ``Conflict`` if a pod of that name exists: the fixed driver pod name makes
        the API server refuse a second driver, whatever this operator believes."""
        return _call(lambda: self._core.create_namespaced_pod(
            pod["metadata"]["namespace"], pod, _preload_content=False, _request_timeout=_TIMEOUT))

    def refusal(self, pod: JsonDict) -> str:
        """Why the API server would refuse to create ``pod``, or "" if it would not: a
        server-side dry run (every admission check runs: Pod Security, policies, quotas;
        nothing is stored)."""
        try:
            _call(lambda: self._core.create_namespaced_pod(
                pod["metadata"]["namespace"], pod, dry_run="All", _preload_content=False, _request_timeout=_TIMEOUT))
        except Refused as refused:
            return f"the API server refuses its pod ({refused.status}): {refused.reason}"
        except Conflict:
            pass  # a pod of that name exists: the decision will see it
        return ""

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int | None = None) -> None:
        """Deletes that very pod (a uid precondition: never a successor of the same name).
        ``grace_seconds`` None keeps the pod's own grace period (SIGTERM, then SIGKILL)."""
        body: JsonDict = {"preconditions": {"uid": uid}}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            _call(lambda: self._core.delete_namespaced_pod(name, namespace, body=body, _preload_content=False,
                                                           _request_timeout=_TIMEOUT))
        except (_NotFound, Conflict):
            pass  # gone already, or the uid precondition failed: another pod took the name

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> bool:
        """Sets annotations on that very pod (its uid in the patch: a successor of the same
        name is refused, not changed). False if the pod is gone or was replaced."""
        body = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        try:
            _call(lambda: self._core.patch_namespaced_pod(
                name, namespace, body, _content_type="application/merge-patch+json", _preload_content=False,
                _request_timeout=_TIMEOUT))
        except (_NotFound, Conflict, Refused):
            return False
        return True

    def ensure_service(self, service: JsonDict) -> None:
        try:
            _call(lambda: self._core.create_namespaced_service(
                service["metadata"]["namespace"], service, _preload_content=False, _request_timeout=_TIMEOUT))
        except Conflict:
            pass  # it exists (a previous epoch created it)

    def log_tail(self, namespace: str, pod: str, container: str, limit_bytes: int = 2048) -> str:
        """The end of a container's log: what FallbackToLogsOnError reports (80 lines, 2 KiB)."""
        try:
            response = self._core.read_namespaced_pod_log(
                pod, namespace, container=container, tail_lines=80, _preload_content=False,
                _request_timeout=_TIMEOUT)
            return bytes(response.data)[-limit_bytes:].decode(errors="replace")
        except (ApiException, urllib3.exceptions.HTTPError):
            return ""

    # ---- prerequisites -------------------------------------------------------------------

    def missing(self, namespace: str, needed: Iterable[Prerequisite]) -> tuple[str, ...]:
        """What of ``needed`` does not exist, one sentence each. Secret values are read by
        the client but only their keys are looked at, and nothing of them is returned."""
        problems = []
        for item in needed:
            try:
                found = self._read_prerequisite(namespace, item)
            except Refused as refused:
                # A Secret in a namespace where the chart gave the operator no Role to read it.
                hint = "; list this namespace in the chart's driver.jobNamespaces" if item.kind == "Secret" else ""
                problems.append(f"{item.field}: the operator may not read {item.kind} {namespace}/{item.name} "
                                f"({refused.reason}){hint}")
                continue
            if found is None:
                problems.append(f"{item.field}: {item.kind} {namespace}/{item.name} does not exist")
                continue
            absent = [k for k in item.keys if k not in (found.get("data") or {})]
            if absent:
                problems.append(f"{item.field}: Secret {namespace}/{item.name} has no key "
                                f"{', '.join(absent)}")
        return tuple(problems)

    def _read_prerequisite(self, namespace: str, item: Prerequisite) -> JsonDict | None:
        readers: dict[str, Callable[..., Any]] = {
            "Secret": self._core.read_namespaced_secret,
            "PersistentVolumeClaim": self._core.read_namespaced_persistent_volume_claim,
            "ServiceAccount": self._core.read_namespaced_service_account,
        }
        read = readers[item.kind]
        return _read(lambda: read(item.name, namespace, _preload_content=False, _request_timeout=_TIMEOUT))


def _read(request: Callable[[], Any]) -> JsonDict | None:
    try:
        return _call(request)
    except _NotFound:
        return None


class _NotFound(Exception):
    pass


def _call(request: Callable[[], Any]) -> JsonDict:
    try:
        response = request()
    except ApiException as error:
        if error.status == 404:
            raise _NotFound() from None
        if error.status == 409:
            raise Conflict(_reason(error)) from None
        if error.status in (400, 403, 422):
            raise Refused(error.status, _reason(error)) from None
        raise ApiUnavailable(f"the API server answered {error.status}: {_reason(error)}") from None
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise ApiUnavailable(f"cannot reach the API server: {error}") from None
    return json.loads(response.data) if response.data else {}


def _reason(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except (TypeError, ValueError):
        return str(error.reason)
