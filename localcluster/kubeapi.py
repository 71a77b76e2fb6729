"""The one thin module that talks to the API server, with plain dicts in and out.

The node agent sends many small requests (bindings, status patches, events) and keeps a
watch open; a raw JSON client over urllib3 keeps that cheap and predictable, where the
generated kubernetes client would build and validate a model object for each of them.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
import yaml

JsonDict = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class ApiConfig:
    """How to reach and authenticate to the apiserver."""

    server: str
    token: str
    ca_pem: bytes

    @classmethod
    def from_kubeconfig(cls, path: Path) -> ApiConfig:
        config = yaml.safe_load(path.read_text())
        context_name = config["current-context"]
        context = _named(config["contexts"], context_name)["context"]
        cluster = _named(config["clusters"], context["cluster"])["cluster"]
        user = _named(config["users"], context["user"])["user"]
        if "certificate-authority-data" in cluster:
            ca_pem = base64.b64decode(cluster["certificate-authority-data"])
        else:
            ca_pem = Path(cluster["certificate-authority"]).read_bytes()
        return cls(server=cluster["server"], token=user["token"], ca_pem=ca_pem)


def _named(items: list[JsonDict], name: str) -> JsonDict:
    return next(item for item in items if item["name"] == name)


class ApiError(Exception):
    """A non-2xx answer; `status` is the HTTP code, `reason` the Status reason (NotFound...)."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        try:
            decoded: JsonDict = json.loads(body)
        except ValueError:
            decoded = {"message": body.decode(errors="replace")}
        self.body = decoded
        self.reason = str(decoded.get("reason", ""))
        super().__init__(f"{status} {self.reason}: {decoded.get('message', '')}")


class ApiUnavailable(ApiError):
    """No answer at all (connection refused, timeout): the apiserver is down or restarting.
    Its `status` is 0, so callers that retry on ApiError retry on this too."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(0, json.dumps({"reason": "Unavailable", "message": str(cause)}).encode())


class WatchExpired(Exception):
    """The resourceVersion we watch from is too old (410 Gone): relist."""


class KubeApi:
    def __init__(self, config: ApiConfig, *, pool_size: int = 16, timeout: float = 30.0) -> None:
        context = ssl.create_default_context(cadata=config.ca_pem.decode())
        self._server = config.server.rstrip("/")
        self._headers = {"Authorization": f"Bearer {config.token}", "Accept": "application/json"}
        self._timeout = timeout
        # block=False: a burst beyond pool_size opens extra connections instead of waiting.
        self._pool = urllib3.PoolManager(
            num_pools=2, maxsize=pool_size, block=False, ssl_context=context, retries=False
        )

    @property
    def server(self) -> str:
        return self._server

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> JsonDict:
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            response = self._pool.request(
                method, self._url(path, query), body=data, headers=headers, timeout=timeout or self._timeout
            )
        except urllib3.exceptions.HTTPError as e:
            raise ApiUnavailable(e) from e
        if response.status >= 300:
            raise ApiError(response.status, response.data)
        result: JsonDict = json.loads(response.data) if response.data else {}
        return result

    def get(self, path: str, **query: Any) -> JsonDict:
        return self.request("GET", path, query=query)

    def get_or_none(self, path: str) -> JsonDict | None:
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def post(self, path: str, body: Any) -> JsonDict:
        return self.request("POST", path, body=body)

    def put(self, path: str, body: Any) -> JsonDict:
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH) -> JsonDict:
        return self.request("PATCH", path, body=body, content_type=content_type)

    def delete(self, path: str, body: Any = None) -> JsonDict:
        return self.request("DELETE", path, body=body)

    def get_text(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """For health endpoints (/readyz): the status code and body, never raises on status."""
        response = self._pool.request("GET", self._url(path, None), headers=self._headers, timeout=timeout)
        return response.status, response.data.decode(errors="replace")

    def watch(
        self, path: str, resource_version: str, timeout_seconds: int = 300, **query: Any
    ) -> Iterator[JsonDict]:
        """Yields watch events ({"type", "object"}) until the server ends the watch.

        Raises WatchExpired on 410 Gone, whether as an HTTP status or as an ERROR event.
        """
        params = dict(query, watch="1", resourceVersion=resource_version, allowWatchBookmarks="true")
        params["timeoutSeconds"] = str(timeout_seconds)
        response = self._pool.request(
            "GET",
            self._url(path, params),
            headers=self._headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=5.0, read=timeout_seconds + 30.0),
        )
        try:
            if response.status == 410:
                raise WatchExpired(path)
            if response.status >= 300:
                raise ApiError(response.status, response.read())
            for event in _json_lines(response):
                yield checked_event(event, path)
        finally:
            response.release_conn()

    def _url(self, path: str, query: Mapping[str, Any] | None) -> str:
        url = self._server + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        return url


def checked_event(event: JsonDict, path: str) -> JsonDict:
    """A watch event, or the error an ERROR event stands for (410 Gone: WatchExpired)."""
    if event.get("type") != "ERROR":
        return event
    status = event.get("object", {})
    if status.get("code") == 410:
        raise WatchExpired(path)
    raise ApiError(int(status.get("code", 500)), json.dumps(status).encode())


def _json_lines(response: urllib3.BaseHTTPResponse) -> Iterator[JsonDict]:
    # The apiserver flushes one JSON document per line; chunks may split or join lines.
    buffer = b""
    for chunk in response.stream(65536):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)


def pod_path(namespace: str, name: str, subresource: str = "") -> str:
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    return f"{path}/{subresource}" if subresource else path


def namespaced_path(namespace: str, plural: str, name: str = "", group_version: str = "v1") -> str:
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path
