"""Events about pods, as kubelet and the scheduler emit them, posted off the hot path."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from localcluster.kubeapi import ApiError, KubeApi, namespaced_path
from localcluster.kubelet.status import rfc3339

JsonDict = dict[str, Any]
log = logging.getLogger(__name__)

KUBELET = "kubelet"
SCHEDULER = "default-scheduler"


def event_object(
    pod: JsonDict,
    kind: str,
    reason: str,
    message: str,
    *,
    node_name: str,
    component: str = KUBELET,
    field_path: str = "",
    now: float,
) -> JsonDict:
    meta = pod["metadata"]
    involved: JsonDict = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": meta["namespace"],
        "name": meta["name"],
        "uid": meta.get("uid", ""),
    }
    if field_path:
        involved["fieldPath"] = field_path
    return {
        "apiVersion": "v1",
        "kind": "Event",
        # kubelet's naming: <object>.<nanoseconds in hex>.
        "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": component, "host": node_name},
        "firstTimestamp": rfc3339(now),
        "lastTimestamp": rfc3339(now),
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": node_name,
    }


def container_field(name: str, init: bool = False) -> str:
    return f"spec.{'initContainers' if init else 'containers'}{{{name}}}"


class EventRecorder:
    """Queues events and posts them from one thread: a slow post never delays a pod."""

    def __init__(self, api: KubeApi, node_name: str) -> None:
        self._api = api
        self._node = node_name
        self._queue: queue.Queue[JsonDict] = queue.Queue(maxsize=10000)
        threading.Thread(target=self._run, name="events", daemon=True).start()

    def normal(self, pod: JsonDict, reason: str, message: str, **kwargs: Any) -> None:
        self._emit(pod, "Normal", reason, message, **kwargs)

    def warning(self, pod: JsonDict, reason: str, message: str, **kwargs: Any) -> None:
        self._emit(pod, "Warning", reason, message, **kwargs)

    def _emit(self, pod: JsonDict, kind: str, reason: str, message: str, **kwargs: Any) -> None:
        event = event_object(pod, kind, reason, message, node_name=self._node, now=time.time(), **kwargs)
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning("dropping event %s for %s: queue full", reason, pod["metadata"]["name"])

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            namespace = event["metadata"]["namespace"]
            try:
                self._api.post(namespaced_path(namespace, "events"), event)
            except ApiError as e:
                # A namespace being deleted refuses new events; nothing to do about it.
                log.debug("event %s not posted: %s", event["reason"], e)
            except Exception:
                log.exception("event %s not posted", event["reason"])
