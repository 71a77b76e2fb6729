"""Reporting a driver's progress to the operator, as an annotation on its own pod.

This is how the operator learns of commits for any backend, including a filesystem on a
PersistentVolumeClaim that the operator cannot mount. Reporting is best effort: a
failure is logged once and never stops the pipeline.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from spark_app import contract

log = logging.getLogger("spark_app")

REFRESH_S = 15.0


class PodReporter:
    def __init__(self, name: str, namespace: str) -> None:
        from kubernetes import client, config

        config.load_incluster_config()
        self._api = client.CoreV1Api()
        self._name = name
        self._namespace = namespace
        self._last: str | None = None
        self._reported_at = 0.0
        self._lock = threading.Lock()
        self._warned = False

    @classmethod
    def from_env(cls) -> PodReporter | None:
        name, namespace = os.environ.get(contract.POD_NAME), os.environ.get(contract.POD_NAMESPACE)
        if not name or not namespace:
            return None
        try:
            return cls(name, namespace)
        except Exception as error:  # noqa: BLE001 - reporting is optional
            log.warning("cannot report progress on pod %s/%s: %s", namespace, name, error)
            return None

    def report(self, status: dict[str, Any]) -> None:
        """Patches the annotation when the status changed, and at least every
        ``REFRESH_S`` anyway, so that the operator can tell a live idle driver from a hung one."""
        body = json.dumps(status, sort_keys=True, separators=(",", ":"))
        with self._lock:
            if body == self._last and time.monotonic() - self._reported_at < REFRESH_S:
                return
            stamped = json.dumps({**status, "reported_ms": int(time.time() * 1000)}, sort_keys=True,
                                 separators=(",", ":"))
            try:
                self._api.patch_namespaced_pod(
                    self._name, self._namespace,
                    {"metadata": {"annotations": {contract.STATUS_ANNOTATION: stamped}}},
                )
                self._last = body
                self._reported_at = time.monotonic()
            except Exception as error:  # noqa: BLE001 - reporting is optional
                if not self._warned:
                    log.warning("cannot report progress on pod %s/%s: %s", self._namespace, self._name, error)
                    self._warned = True
