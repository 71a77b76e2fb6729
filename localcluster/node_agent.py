"""The node agent: kubelet and scheduler of the local cluster, in one process.

    python -m localcluster.node_agent --repo=. --venv=.venv --port=N --node-name=local-node

It registers a Ready Node and renews its Lease, binds pending pods to it, runs each pod
(kubelet/pods.py) and serves `kubectl logs` (kubelet/logs.py). One watch on all pods drives
it: a pod is bound and started as soon as its creation event arrives. A watch on Services
keeps the pods' hosts files (kubelet/hosts.py) in step with them; one on claims provisions
their volumes. On SIGTERM it stops
every pod's processes and exits, leaving the pods in the API (as a node going down would).
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from localcluster.kubeapi import ApiConfig, ApiError, KubeApi, WatchExpired, pod_path
from localcluster.kubelet import node as nodes
from localcluster.kubelet import storage
from localcluster.kubelet.events import SCHEDULER, EventRecorder
from localcluster.kubelet.hosts import ServiceKey, service_key
from localcluster.kubelet.images import ImageMap, load_image_map
from localcluster.kubelet.launch import pod_log_dir
from localcluster.kubelet.logs import LogServer
from localcluster.kubelet.pods import PodContext, PodWorker, is_terminal, remove_pod_folder
from localcluster.kubelet.runtime import kill_leftovers
from localcluster.layout import NODE_NAME, Layout
from localcluster.pki import Pki

JsonDict = dict[str, Any]
log = logging.getLogger("node-agent")

HEARTBEAT_SECONDS = 10.0
WATCH_SECONDS = 300
SHUTDOWN_SECONDS = 50.0
SCHEDULER_NAMES = ("", "default-scheduler")


@dataclass(frozen=True)
class AgentSettings:
    repo: Path
    """The repository root: images.yaml placeholders and .cache/cluster."""
    venv: Path
    """The virtualenv: its python runs container_init and `python` images."""
    port: int
    """The kubelet API port (HTTPS on 127.0.0.1), published in the Node's daemonEndpoints."""
    node_name: str = NODE_NAME

    @classmethod
    def from_args(cls, argv: Sequence[str]) -> AgentSettings:
        parser = argparse.ArgumentParser(prog="localcluster.node_agent")
        parser.add_argument("--repo", type=Path, required=True)
        parser.add_argument("--venv", type=Path, required=True)
        parser.add_argument("--port", type=int, required=True)
        parser.add_argument("--node-name", default=NODE_NAME)
        args = parser.parse_args(argv)
        return cls(args.repo.resolve(), args.venv.absolute(), args.port, args.node_name)


def schedulable(pod: JsonDict, node_labels: dict[str, str]) -> bool:
    """Whether the agent, acting as the scheduler, binds this pod to its node. Pure."""
    spec = pod.get("spec", {})
    if spec.get("nodeName") or pod["metadata"].get("deletionTimestamp"):
        return False
    if spec.get("schedulerName", "default-scheduler") not in SCHEDULER_NAMES:
        return False
    if pod.get("status", {}).get("phase", "Pending") != "Pending":
        return False
    selector = spec.get("nodeSelector") or {}
    return all(node_labels.get(k) == v for k, v in selector.items())


class ImageMapFile:
    """images.yaml, re-read when it changes so edits apply without restarting the agent."""

    def __init__(self, path: Path, placeholders: dict[str, str]) -> None:
        self._path = path
        self._placeholders = placeholders
        self._mtime = -1.0
        self._map = ImageMap()
        self._lock = threading.Lock()

    def __call__(self) -> ImageMap:
        with self._lock:
            mtime = self._path.stat().st_mtime
            if mtime != self._mtime:
                self._mtime = mtime
                try:
                    self._map = load_image_map(self._path.read_text(), self._placeholders)
                except (yaml.YAMLError, AttributeError, TypeError) as e:
                    # A half-edited file: keep running what we had.
                    log.warning("%s is not valid, keeping the previous image map: %s", self._path, e)
            return self._map


class NodeAgent:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.layout = Layout(settings.repo, settings.venv)
        config = ApiConfig.from_kubeconfig(self.layout.component_kubeconfig("node-agent"))
        self.api = KubeApi(config, pool_size=32)
        self.events = EventRecorder(self.api, settings.node_name)
        server = urlsplit(config.server)
        self._services: frozenset[ServiceKey] = frozenset()
        self.ctx = PodContext(
            api=self.api,
            events=self.events,
            node_name=settings.node_name,
            apiserver_host=server.hostname or "127.0.0.1",
            apiserver_port=server.port or 443,
            pods_dir=self.layout.pods_dir,
            pv_dir=self.layout.pv_dir,
            logs_root=self.layout.pod_logs_dir,
            python=str(self.layout.python),
            images=ImageMapFile(self.layout.images_file, _placeholders(self.layout)),
            host_env=dict(os.environ),
            services=lambda: self._services,
            host_hosts=Path("/etc/hosts").read_text(),
        )
        self._workers: dict[str, PodWorker] = {}
        self._finished: set[str] = set()
        self._bound: set[str] = set()
        self._pods: dict[tuple[str, str], JsonDict] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stop_requests: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._node_labels: dict[str, str] = {}
        self._node_uid = ""
        self._facts = nodes.host_facts()
        self._ready_since = time.time()

    # ---- main --------------------------------------------------------------------------

    def run(self) -> None:
        killed = kill_leftovers(self.layout.pods_dir)
        if killed:
            log.info("killed %d container process groups left by a previous agent", len(killed))
        self._register_node()
        self._ensure_storage_class()
        pki = Pki(self.layout.pki_dir)
        server = LogServer(self.settings.port, self, pki.cert("kubelet"), pki.key("kubelet"), pki.ca_cert)
        server.start()
        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
        pods = threading.Thread(
            target=self._watch,
            args=("/api/v1/pods", self._on_pod_event, self._on_pod_list),
            name="watch-pods",
        )
        claims = threading.Thread(
            target=self._watch,
            args=("/api/v1/persistentvolumeclaims", self._on_claim_event, self._on_claim_list),
            name="watch-claims",
        )
        services = threading.Thread(
            target=self._watch,
            args=("/api/v1/services", self._on_service_event, self._on_service_list),
            name="watch-services",
        )
        for thread in (pods, claims, services):
            thread.daemon = True
            thread.start()
        log.info("node %s ready; kubelet API on 127.0.0.1:%d", self.settings.node_name, self.settings.port)
        self._stop_requests.get()
        self._stop.set()
        self._shutdown()
        server.shutdown()

    def stop(self) -> None:
        """Safe in a signal handler: it takes no lock (SimpleQueue.put is reentrant). Setting
        the event there, on which the main thread waited, could wait for a lock the main
        thread held when the signal came, for ever."""
        self._stop_requests.put(None)

    def _shutdown(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
        log.info("stopping the processes of %d pods", len(workers))
        for worker in workers:
            worker.shutdown()
        deadline = time.monotonic() + SHUTDOWN_SECONDS
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    # ---- node and lease ----------------------------------------------------------------

    def _register_node(self) -> None:
        name = self.settings.node_name
        now = time.time()
        node = self.api.get_or_none(f"/api/v1/nodes/{name}")
        if node is None:
            node = self.api.post(
                "/api/v1/nodes", nodes.node_object(name, self._facts, self.settings.port, now)
            )
            log.info("registered node %s", name)
        self._node_uid = node["metadata"]["uid"]
        self._node_labels = node["metadata"].get("labels") or {}
        self._post_node_status(now)
        self._renew_lease(now)

    def _post_node_status(self, now: float) -> None:
        status = nodes.node_status(self._facts, self.settings.port, now, self._ready_since)
        node = self.api.patch(f"/api/v1/nodes/{self.settings.node_name}/status", {"status": status})
        self._node_labels = node["metadata"].get("labels") or {}

    def _renew_lease(self, now: float) -> None:
        lease = nodes.lease_object(self.settings.node_name, self._node_uid, now)
        path = f"/apis/coordination.k8s.io/v1/namespaces/{nodes.LEASE_NAMESPACE}/leases/{self.settings.node_name}"
        try:
            self.api.patch(path, {"spec": lease["spec"]})
        except ApiError as e:
            if e.status != 404:
                raise
            self.api.post(path.rsplit("/", 1)[0], lease)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                now = time.time()
                self._renew_lease(now)
                self._post_node_status(now)
            except ApiError as e:
                if e.status == 404:  # someone deleted the Node: register again
                    self._register_node()
                else:
                    log.warning("heartbeat failed: %s", e)
            except Exception as e:
                log.warning("heartbeat failed: %s", e)

    # ---- pods --------------------------------------------------------------------------

    def _watch(
        self, path: str, on_event: Callable[[str, JsonDict], None], on_list: Callable[[list[JsonDict]], None]
    ) -> None:
        """List, then watch from the list's resourceVersion; relist when it expires (410)."""
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    listing = self.api.get(path)
                    on_list(listing["items"])
                    resource_version = str(listing["metadata"]["resourceVersion"])
                for event in self.api.watch(path, resource_version, WATCH_SECONDS):
                    resource_version = event["object"]["metadata"]["resourceVersion"]
                    on_event(event["type"], event["object"])
            except WatchExpired:
                log.info("watch of %s expired (410 Gone): relisting", path)
                resource_version = None
            except Exception as e:
                log.warning("watch of %s failed, retrying: %s", path, e)
                time.sleep(1.0)

    def _on_pod_event(self, kind: str, pod: JsonDict) -> None:
        if kind == "DELETED":
            self._on_deleted(pod)
        elif kind in ("ADDED", "MODIFIED"):
            self._on_pod(pod)

    def _on_pod_list(self, pods: list[JsonDict]) -> None:
        seen = {pod["metadata"]["uid"] for pod in pods}
        with self._lock:
            vanished = [w for uid, w in self._workers.items() if uid not in seen]
        for worker in vanished:
            worker.gone()
        for pod in pods:
            self._on_pod(pod)

    def _on_pod(self, pod: JsonDict) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        self._pods[(meta["namespace"], meta["name"])] = pod
        node = pod["spec"].get("nodeName")
        if not node:
            if uid not in self._bound and schedulable(pod, self._node_labels):
                self._bind(pod)
            return
        if node != self.settings.node_name:
            return
        with self._lock:
            worker = self._workers.get(uid)
            finished = uid in self._finished
        if worker is not None:
            worker.update(pod)
        elif meta.get("deletionTimestamp") and (finished or is_terminal(pod)):
            self._remove(pod)
        elif not finished and not is_terminal(pod):
            self._start_worker(pod)

    def _on_deleted(self, pod: JsonDict) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        key = (meta["namespace"], meta["name"])
        if self._pods.get(key, {}).get("metadata", {}).get("uid") == uid:
            del self._pods[key]
        with self._lock:
            worker = self._workers.get(uid)
            self._finished.discard(uid)
            self._bound.discard(uid)
        if worker is not None:
            worker.gone()
        elif pod["spec"].get("nodeName") == self.settings.node_name:
            remove_pod_folder(self.ctx, uid)

    def _bind(self, pod: JsonDict) -> None:
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.settings.node_name},
        }
        try:
            self.api.post(pod_path(meta["namespace"], meta["name"], "binding"), binding)
        except ApiError as e:
            log.info("binding %s/%s failed: %s", meta["namespace"], meta["name"], e)
            return
        self._bound.add(meta["uid"])
        message = f"Successfully assigned {meta['namespace']}/{meta['name']} to {self.settings.node_name}"
        self.events.normal(pod, "Scheduled", message, component=SCHEDULER)
        # Start at once rather than wait for the watch to show the binding.
        bound = dict(pod, spec=dict(pod["spec"], nodeName=self.settings.node_name))
        self._start_worker(bound)

    def _start_worker(self, pod: JsonDict) -> None:
        worker = PodWorker(pod, self.ctx, self._worker_done)
        with self._lock:
            self._workers[worker.uid] = worker
        worker.start()

    def _worker_done(self, worker: PodWorker) -> None:
        with self._lock:
            self._workers.pop(worker.uid, None)
            # Late watch events of this pod must not start it again.
            self._finished.add(worker.uid)

    def _remove(self, pod: JsonDict) -> None:
        """A finished pod being deleted: nothing runs any more, remove it at once."""
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        try:
            self.api.delete(pod_path(meta["namespace"], meta["name"]), body)
        except ApiError as e:
            if e.status not in (404, 409):
                log.warning("removing %s/%s failed: %s", meta["namespace"], meta["name"], e)

    # ---- services, for the pods' hosts files --------------------------------------------

    def _on_service_list(self, services: list[JsonDict]) -> None:
        keys = {service_key(s) for s in services}
        self._set_services({key for key in keys if key is not None})

    def _on_service_event(self, kind: str, service: JsonDict) -> None:
        meta = service["metadata"]
        current = set(self._services)
        current.discard((meta["namespace"], meta["name"]))
        key = service_key(service)
        if kind != "DELETED" and key is not None:
            current.add(key)
        self._set_services(current)

    def _set_services(self, services: set[ServiceKey]) -> None:
        with self._lock:
            if services == self._services:
                return
            self._services = frozenset(services)
            workers = list(self._workers.values())
        for worker in workers:
            worker.services_changed()

    # ---- persistent volume claims ------------------------------------------------------

    def _ensure_storage_class(self) -> None:
        try:
            self.api.post("/apis/storage.k8s.io/v1/storageclasses", storage.storage_class())
        except ApiError as e:
            if e.status != 409:
                raise

    def _on_claim_event(self, kind: str, claim: JsonDict) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self._provision(claim)
        elif kind == "DELETED":
            # The folder stays (a claim of the same name finds it again); the volume object
            # goes, or Released volumes would pile up over test runs.
            self._delete_volume(storage.volume_name(claim))

    def _delete_volume(self, name: str) -> None:
        try:
            self.api.delete(f"/api/v1/persistentvolumes/{name}")
        except ApiError as e:
            if e.status != 404:
                log.warning("deleting volume %s failed: %s", name, e)

    def _on_claim_list(self, claims: list[JsonDict]) -> None:
        for claim in claims:
            self._provision(claim)
        # Claims deleted while the agent was not watching.
        live = {claim["metadata"]["uid"] for claim in claims}
        for volume in self.api.get("/api/v1/persistentvolumes")["items"]:
            if storage.is_orphan(volume, live):
                self._delete_volume(volume["metadata"]["name"])

    def _provision(self, claim: JsonDict) -> None:
        """Creates the claim's PersistentVolume; the controller manager binds the two."""
        if not storage.needs_volume(claim):
            return
        try:
            self.api.post("/api/v1/persistentvolumes", storage.volume_for(claim, self.layout.pv_dir))
        except ApiError as e:
            if e.status != 409:
                log.warning("provisioning a volume for %s failed: %s", claim["metadata"]["name"], e)

    # ---- LogLocator, for the kubelet API -----------------------------------------------

    def container_log_dir(self, namespace: str, pod: str, container: str) -> Path | None:
        known = self._pods.get((namespace, pod))
        if known is not None:
            return pod_log_dir(self.layout.pod_logs_dir, namespace, pod, known["metadata"]["uid"]) / container
        candidates = sorted(
            self.layout.pod_logs_dir.glob(f"{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime
        )
        return candidates[-1] / container if candidates else None

    def is_running(self, namespace: str, pod: str, container: str) -> bool:
        known = self._pods.get((namespace, pod))
        if known is None:
            return False
        with self._lock:
            worker = self._workers.get(known["metadata"]["uid"])
        return worker is not None and worker.container_running(container)


def _placeholders(layout: Layout) -> dict[str, str]:
    return {"repo": str(layout.repo), "venv": str(layout.venv), "python": str(layout.python)}


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s: %(message)s")
    settings = AgentSettings.from_args(sys.argv[1:] if argv is None else argv)
    agent = NodeAgent(settings)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    agent.run()
    log.info("node agent stopped")


if __name__ == "__main__":
    main()
