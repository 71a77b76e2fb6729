"""Reporting a driver's progress to the operator, as an annotation on its own pod.

This is how the operator learns of commits for any backend, including a filesystem on a
PersistentVolumeClaim that the operator cannot mount. Reporting is best effort and off
the commit path: ``report`` only hands the newest status to a thread of its own, which
patches the pod with a request timeout. A slow or half-open connection to the API server
delays the report, never a commit; a failure is logged once and never stops the pipeline.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from spark_app import contract

log = logging.getLogger("spark_app")

REFRESH_S = 15.0
"""An unchanged status is reported again this often, so that the operator can tell a live
idle driver from a hung one."""
REQUEST_TIMEOUT_S = (5.0, 10.0)
"""Connect and read timeouts of one patch."""

Patch = Callable[[dict[str, Any]], None]


def import_client_early(environ: Mapping[str, str] = os.environ) -> threading.Thread | None:
    """In a driver's pod, imports the Kubernetes client in a thread of its own while the
    JVM starts (the entrypoint calls this just after launching it). The import takes 0.3 s
    of one core; ``PodReporter.for_pod`` ran it between the session and the query's start,
    on the way to a relaunched driver's first output, while during the JVM's start this
    process only waits. ``for_pod``'s own import then finds it done, or waits for it."""
    if not (environ.get(contract.POD_NAME) and environ.get(contract.POD_NAMESPACE)):
        return None
    thread = threading.Thread(target=_import_client, name="spark_app-import-kubernetes", daemon=True)
    thread.start()
    return thread


def _import_client() -> None:
    try:
        import kubernetes.client  # noqa: F401
        import kubernetes.config  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - for_pod imports it again and says why it cannot
        pass


class PodReporter:
    def __init__(self, patch: Patch, where: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._patch = patch
        self._where = where
        self._clock = clock
        self._latest: tuple[contract.DriverReport, str] | None = None
        """The newest status to report, and its JSON (unstamped, to tell a change)."""
        self._sent: str | None = None
        """The last status sent or tried."""
        self._sent_at = 0.0
        self._wake = threading.Condition()
        self._closed = False
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="spark_app-report", daemon=True)
        self._thread.start()

    @classmethod
    def for_pod(cls, name: str | None, namespace: str | None) -> PodReporter | None:
        """A reporter on the driver's own pod, or None outside Kubernetes (no pod named)."""
        if not name or not namespace:
            return None
        try:
            from kubernetes import client, config

            config.load_incluster_config()
            api = client.CoreV1Api()
        except Exception as error:  # noqa: BLE001 - reporting is optional
            log.warning("cannot report progress on pod %s/%s: %s", namespace, name, error)
            return None

        def patch(annotations: dict[str, Any]) -> None:
            api.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}},
                                     _request_timeout=REQUEST_TIMEOUT_S)

        return cls(patch, f"pod {namespace}/{name}")

    def report(self, status: contract.DriverReport) -> None:
        """Queues ``status`` as the one to report; returns at once."""
        with self._wake:
            self._latest = (status, status.to_json())
            self._wake.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Sends what is queued, if that can be done within ``timeout``."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self._due():
                    self._wake.wait(timeout=max(0.1, REFRESH_S - (self._clock() - self._sent_at)))
                latest, closing = self._latest, self._closed
            if latest is not None and (latest[1] != self._sent or self._clock() - self._sent_at >= REFRESH_S):
                self._send(*latest)
            if closing:
                return

    def _due(self) -> bool:
        if self._latest is None:
            return False
        return self._latest[1] != self._sent or self._clock() - self._sent_at >= REFRESH_S

    def _send(self, status: contract.DriverReport, body: str) -> None:
        stamped = replace(status, reported_at=time.time()).to_json()
        try:
            self._patch({contract.STATUS_ANNOTATION: stamped})
        except Exception as error:  # noqa: BLE001 - reporting is optional
            if not self._warned:
                log.warning("cannot report progress on %s: %s", self._where, error)
                self._warned = True
        # Failed or not, the next attempt waits for a change or the refresh: never a loop.
        self._sent, self._sent_at = body, self._clock()
