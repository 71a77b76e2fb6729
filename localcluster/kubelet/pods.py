"""The life of one pod on the node: volumes, init containers, containers, probes, restarts,
status, graceful deletion. One thread per pod, woken by pod updates, process exits and
probe results; it sleeps until the next thing it has to do, never polls the API.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster.kubeapi import ApiError, KubeApi, namespaced_path, pod_path
from localcluster.kubelet import status as st
from localcluster.kubelet.containers import (
    Backoff,
    Container,
    parse_time,
    restore_container,
    should_restart,
    terminated_run,
)
from localcluster.kubelet.envvars import ConfigError, ObjectKey, referenced_objects, resolve_env, service_env
from localcluster.kubelet.events import EventRecorder, container_field
from localcluster.kubelet.hosts import ServiceKey, hosts_file, write_in_place
from localcluster.kubelet.images import ImageConfig, ImageMap, normalize_repository
from localcluster.kubelet.launch import LaunchError, PodPaths, base_env, build_launch
from localcluster.kubelet.probes import Prober, ProbeTarget, check
from localcluster.kubelet.runtime import ContainerProcess
from localcluster.kubelet.volumes import (
    TokenSpec,
    VolumeError,
    VolumePlan,
    object_refs,
    plan_volumes,
    token_specs,
    volume_files,
    write_files,
)

JsonDict = dict[str, Any]
log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 30
IMAGE_PULL_BACKOFF_AFTER = 1.0
CONFIG_RETRY = (1.0, 10.0)
MOUNT_RETRY_SECONDS = 2.0
STATUS_RETRY_SECONDS = 1.0
API_RETRY_SECONDS = 1.0
TOKEN_REFRESH_FRACTION = 0.8
# A container that ran this long without failing starts its back-off from scratch.
BACKOFF_RESET_SECONDS = 600.0


@dataclass(frozen=True)
class PodContext:
    """What every pod worker shares, set up once by the node agent."""

    api: KubeApi
    events: EventRecorder
    node_name: str
    apiserver_host: str
    apiserver_port: int
    pods_dir: Path
    pv_dir: Path
    logs_root: Path
    python: str
    images: Callable[[], ImageMap]
    host_env: Mapping[str, str]
    services: Callable[[], frozenset[ServiceKey]] = frozenset
    """The cluster's Services now, for the pods' hosts files (kubelet/hosts.py)."""
    host_hosts: str = "127.0.0.1\tlocalhost\n"
    """The host's /etc/hosts, which every pod's hosts file starts with."""
    crash_backoff: Backoff = Backoff()
    image_backoff: Backoff = Backoff()


def is_terminal(pod: JsonDict) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


class PodGone(Exception):
    """The pod (this uid) no longer exists in the API."""


class PodWorker:
    """Runs one pod. `update` hands it newer versions of the pod; `gone` says it was
    deleted from the API; `shutdown` stops its processes without touching the API."""

    def __init__(self, pod: JsonDict, ctx: PodContext, on_done: Callable[[PodWorker], None]) -> None:
        self.uid: str = pod["metadata"]["uid"]
        self.namespace: str = pod["metadata"]["namespace"]
        self.name: str = pod["metadata"]["name"]
        self._ctx = ctx
        self._on_done = on_done
        self._pod = pod
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._gone = False
        self._shutdown = False
        self._services_changed = False
        self._metadata_changed = False
        self._paths = PodPaths(ctx.pods_dir / self.uid, ctx.logs_root)
        spec = pod["spec"]
        self._init = [Container(c, True) for c in spec.get("initContainers") or ()]
        waiting_reason = "PodInitializing" if self._init else "ContainerCreating"
        self._containers = [Container(c, False, reason=waiting_reason) for c in spec.get("containers") or ()]
        self._restart_policy: str = spec.get("restartPolicy", "Always")
        self._volumes: dict[str, VolumePlan] | None = None
        self._prepare_at = 0.0
        self._token_refresh_at: float | None = None
        self._start_time = time.time()
        self._reported: JsonDict | None = None
        self._report_at = 0.0
        self._deleting = False
        self._thread = threading.Thread(
            target=self._run, name=f"pod-{self.namespace}/{self.name}", daemon=True
        )

    # ---- called from other threads ------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def update(self, pod: JsonDict) -> None:
        with self._lock:
            before = self._pod["metadata"]
            self._pod = pod
            after = pod["metadata"]
            # Labels and annotations shown in downwardAPI volumes are rewritten when they
            # change, as kubelet does (it lets a running process see new settings).
            if (before.get("labels"), before.get("annotations")) != (after.get("labels"), after.get("annotations")):
                self._metadata_changed = True
        self._wake.set()

    def gone(self) -> None:
        self._gone = True
        self._wake.set()

    def shutdown(self) -> None:
        self._shutdown = True
        self._wake.set()

    def services_changed(self) -> None:
        """The cluster's Services changed: the pod's hosts file is written again."""
        self._services_changed = True
        self._wake.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def container_running(self, name: str) -> bool:
        return any(c.process is not None for c in self._init + self._containers if c.name == name)

    # ---- the worker thread ------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._restore_from_status()
            self._loop()
        except PodGone:
            self._stop_everything(self._grace_seconds())
        except Exception:
            log.exception("pod %s/%s: worker failed", self.namespace, self.name)
            self._stop_everything(0)
        finally:
            self._on_done(self)

    def _loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                if self._step():
                    return
            except ApiError as e:
                # The apiserver is restarting, or refused something we will try again.
                log.warning("will retry after an API error: %s", e)
                self._wake.wait(API_RETRY_SECONDS)
                continue
            self._wake.wait(self._sleep_seconds())

    def _step(self) -> bool:
        """One pass over the pod; True when the worker is done with it."""
        pod = self._current()
        if self._shutdown:
            self._stop_everything(self._grace_seconds())
            return True
        if self._gone:
            raise PodGone()
        if pod["metadata"].get("deletionTimestamp"):
            self._terminate()
            return True
        now = time.time()
        if self._volumes is None and now >= self._prepare_at:
            self._prepare()
        if self._volumes is not None:
            self._refresh_tokens_if_due(now)
            self._refresh_downward_api_if_changed()
            self._refresh_hosts_if_changed()
            self._sync_containers(now)
        self._report_status()
        return self._finished()

    def _current(self) -> JsonDict:
        with self._lock:
            return self._pod

    def _finished(self) -> bool:
        phase = st.pod_phase(self._restart_policy, self._views(True), self._views(False))
        running = any(c.process is not None for c in self._init + self._containers)
        # Done only once the API has been told: a failed status update is retried first.
        reported = self._reported is not None and self._reported["phase"] == phase
        return phase in ("Succeeded", "Failed") and not running and reported

    def _sleep_seconds(self) -> float:
        now = time.time()
        deadlines = [now + 30.0]
        if self._volumes is None:
            deadlines.append(self._prepare_at)
        if self._token_refresh_at is not None:
            deadlines.append(self._token_refresh_at)
        if self._report_at > now:
            deadlines.append(self._report_at)
        for c in self._init + self._containers:
            if c.process is None and c.terminated is None:
                deadlines.append(c.next_start)
            if c.pull_failed_at is not None and c.reason == "ErrImagePull":
                deadlines.append(c.pull_failed_at + IMAGE_PULL_BACKOFF_AFTER)
            if c.kill_deadline is not None:
                deadlines.append(c.kill_deadline)
        return max(0.0, min(deadlines) - now)

    # ---- preparing volumes -------------------------------------------------------------

    def _prepare(self) -> None:
        pod = self._current()
        try:
            plans = plan_volumes(pod, self._paths.pod_dir, self._ctx.pv_dir)
            self._check_claims(plans)
            self._create_folders(plans)
            self._write_file_volumes(pod, plans)
            self._write_hosts()
        except VolumeError as e:
            self._ctx.events.warning(pod, "FailedMount", f"MountVolume.SetUp failed: {e}")
            self._prepare_at = time.time() + MOUNT_RETRY_SECONDS
            return
        except (ApiError, OSError) as e:
            log.warning("pod %s/%s: preparing volumes failed, retrying: %s", self.namespace, self.name, e)
            self._prepare_at = time.time() + MOUNT_RETRY_SECONDS
            return
        self._volumes = plans

    def _check_claims(self, plans: Mapping[str, VolumePlan]) -> None:
        for plan in plans.values():
            if plan.claim is None:
                continue
            path = namespaced_path(self.namespace, "persistentvolumeclaims", plan.claim)
            if self._ctx.api.get_or_none(path) is None:
                raise VolumeError(f'persistentvolumeclaim "{plan.claim}" not found')

    def _create_folders(self, plans: Mapping[str, VolumePlan]) -> None:
        for plan in plans.values():
            if plan.kind != "hostPath":
                Path(plan.path).mkdir(parents=True, exist_ok=True)
                continue
            kind = plan.source.get("type", "")
            path = Path(plan.path)
            if kind in ("", "DirectoryOrCreate") and not path.exists():
                # Docker creates a missing hostPath of no type as a folder; kubelet then binds it.
                path.mkdir(parents=True, exist_ok=True)
            elif kind == "FileOrCreate":
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch(exist_ok=True)
            elif kind == "Directory" and not path.is_dir():
                raise VolumeError(f"hostPath type check failed: {path} is not a directory")
            elif kind == "File" and not path.is_file():
                raise VolumeError(f"hostPath type check failed: {path} is not a file")

    def _write_file_volumes(self, pod: JsonDict, plans: Mapping[str, VolumePlan]) -> None:
        file_plans = [
            p for p in plans.values() if p.kind in ("configMap", "secret", "downwardAPI", "projected")
        ]
        refs: set[ObjectKey] = set().union(*(object_refs(p) for p in file_plans)) if file_plans else set()
        objects = self._fetch_objects(refs)
        tokens, refresh_at = self._request_tokens(pod, [s for p in file_plans for s in token_specs(p)])
        for plan in file_plans:
            write_files(Path(plan.path), volume_files(plan, pod, objects, tokens))
        self._token_refresh_at = refresh_at

    def _fetch_objects(self, refs: set[ObjectKey]) -> dict[ObjectKey, JsonDict | None]:
        plural = {"Secret": "secrets", "ConfigMap": "configmaps"}
        return {
            (kind, name): self._ctx.api.get_or_none(namespaced_path(self.namespace, plural[kind], name))
            for kind, name in refs
        }

    def _request_tokens(
        self, pod: JsonDict, specs: list[TokenSpec]
    ) -> tuple[dict[TokenSpec, str], float | None]:
        """TokenRequest for each projected token, bound to this pod, as kubelet does."""
        tokens: dict[TokenSpec, str] = {}
        refresh_at: float | None = None
        account = pod["spec"].get("serviceAccountName") or "default"
        for spec in specs:
            body = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": [spec.audience] if spec.audience else [],
                    "expirationSeconds": spec.expiration_seconds,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid},
                },
            }
            path = namespaced_path(self.namespace, "serviceaccounts", f"{account}/token")
            try:
                answer = self._ctx.api.post(path, body)
            except ApiError as e:
                raise VolumeError(f"failed to fetch token for service account {account}: {e}") from e
            tokens[spec] = answer["status"]["token"]
            lifetime = _token_lifetime(answer, spec.expiration_seconds)
            due = time.time() + TOKEN_REFRESH_FRACTION * lifetime
            refresh_at = due if refresh_at is None else min(refresh_at, due)
        return tokens, refresh_at

    def _refresh_tokens_if_due(self, now: float) -> None:
        if self._token_refresh_at is None or now < self._token_refresh_at or self._volumes is None:
            return
        try:
            self._write_file_volumes(self._current(), self._volumes)
        except VolumeError as e:
            log.warning("pod %s/%s: token refresh failed, retrying: %s", self.namespace, self.name, e)
            self._token_refresh_at = now + MOUNT_RETRY_SECONDS

    def _refresh_downward_api_if_changed(self) -> None:
        if not self._metadata_changed or self._volumes is None:
            return
        self._metadata_changed = False
        pod = self._current()
        for plan in self._volumes.values():
            if plan.kind == "downwardAPI":  # no objects or tokens: the pod's own fields only
                try:
                    write_files(Path(plan.path), volume_files(plan, pod, {}, {}))
                except (VolumeError, ConfigError) as e:
                    log.warning("pod %s/%s: rewriting volume %s failed: %s", self.namespace, self.name, plan.name, e)

    def _write_hosts(self) -> None:
        self._services_changed = False
        content = hosts_file(self._current(), self._ctx.host_hosts, self._ctx.services())
        self._paths.pod_dir.mkdir(parents=True, exist_ok=True)
        write_in_place(self._paths.hosts_file, content)

    def _refresh_hosts_if_changed(self) -> None:
        if not self._services_changed:
            return
        try:
            self._write_hosts()
        except OSError as e:
            log.warning("pod %s/%s: rewriting its hosts file failed: %s", self.namespace, self.name, e)

    # ---- containers --------------------------------------------------------------------

    def _sync_containers(self, now: float) -> None:
        for c in self._init + self._containers:
            self._handle_exit(c, now)
            self._handle_probes(c, now)
            if (
                c.reason == "ErrImagePull"
                and c.pull_failed_at
                and now >= c.pull_failed_at + IMAGE_PULL_BACKOFF_AFTER
            ):
                c.reason = "ImagePullBackOff"
                c.message = f'Back-off pulling image "{c.spec.get("image")}"'
        pending_init = next((c for c in self._init if not c.succeeded), None)
        # Init containers run one at a time, in order; the others wait for all of them.
        due = [pending_init] if pending_init is not None else self._containers
        for c in due:
            if c.process is None and c.terminated is None and now >= c.next_start:
                self._start(c, now)

    def _start(self, c: Container, now: float) -> None:
        pod = self._current()
        image = self._ctx.images().resolve(str(c.spec.get("image", "")))
        field_path = container_field(c.name, c.init)
        if image is None:
            self._image_not_found(c, pod, now, field_path)
            return
        if c.pull_failed_at is not None or c.runs == 0:
            c.pull_failed_at = None
            self._ctx.events.normal(
                pod, "Pulled", f'Container image "{c.spec.get("image")}" already present on machine',
                field_path=field_path,
            )  # fmt: skip
        try:
            env = self._container_env(pod, c, image)
            spec = build_launch(
                pod, c.spec, image, env, self._volumes or {}, self._paths, c.restart_count + (c.runs > 0)
            )
        except (ConfigError, LaunchError) as e:
            reason = "CreateContainerConfigError" if isinstance(e, ConfigError) else "CreateContainerError"
            self._wait_with(c, reason, str(e), now, CONFIG_RETRY)
            self._ctx.events.warning(pod, "Failed", f"Error: {e}", field_path=field_path)
            return
        if c.runs > 0:
            c.restart_count += 1
        c.runs += 1
        c.retry_backoff = 0.0
        c.reason, c.message = "", ""
        c.launch_env, c.launch_cwd = dict(spec.env), spec.cwd
        c.image_id = "localcluster://" + normalize_repository(str(c.spec.get("image", "")))
        c.process = ContainerProcess(spec, self._ctx.python, on_exit=self._wake.set)
        log.info("started %s (pid %d, run %d)", c.name, c.process.pid, c.runs)
        self._ctx.events.normal(pod, "Created", f"Created container: {c.name}", field_path=field_path)
        self._ctx.events.normal(pod, "Started", f"Started container {c.name}", field_path=field_path)
        self._start_probers(c, startup=True)

    def _wait_with(
        self, c: Container, reason: str, message: str, now: float, retry: tuple[float, float]
    ) -> None:
        c.reason, c.message = reason, message
        c.retry_backoff = retry[0] if c.retry_backoff <= 0 else min(c.retry_backoff * 2, retry[1])
        c.next_start = now + c.retry_backoff

    def _image_not_found(self, c: Container, pod: JsonDict, now: float, field_path: str) -> None:
        image = c.spec.get("image")
        message = (
            f'Failed to pull image "{image}": the local cluster has no such image: '
            f"add its repository to localcluster/images.yaml"
        )
        c.reason, c.message = "ErrImagePull", message
        c.pull_failed_at = now
        c.retry_backoff = self._ctx.image_backoff.next(c.retry_backoff)
        c.next_start = now + c.retry_backoff
        self._ctx.events.warning(pod, "Failed", message, field_path=field_path)
        self._ctx.events.warning(pod, "Failed", "Error: ErrImagePull", field_path=field_path)
        self._ctx.events.normal(pod, "BackOff", f'Back-off pulling image "{image}"', field_path=field_path)

    def _container_env(self, pod: JsonDict, c: Container, image: ImageConfig) -> dict[str, str]:
        objects = self._fetch_objects(referenced_objects(c.spec))
        base = base_env(pod, image, self._ctx.host_env)
        base += service_env(self._ctx.apiserver_host, self._ctx.apiserver_port)
        return resolve_env(c.spec, pod, objects, base)

    def _handle_exit(self, c: Container, now: float) -> None:
        process = c.process
        if process is None or process.running:
            if c.kill_deadline is not None and process is not None and now >= c.kill_deadline:
                process.kill()
            return
        terminated = self._record_exit(c, process)
        log.info("%s exited with %d (%s)", c.name, terminated.exit_code, terminated.reason)
        pod = self._current()
        if terminated.reason == "StartError":
            self._ctx.events.warning(
                pod, "Failed", f"Error: {terminated.message}", field_path=container_field(c.name, c.init)
            )
        if not should_restart(self._restart_policy, c.init, terminated.exit_code):
            c.terminated = terminated
            return
        c.last_terminated = terminated
        ran = (process.finished_at or now) - (process.started_at or process.created_at)
        if ran > BACKOFF_RESET_SECONDS:
            c.crash_backoff = 0.0
        delay = c.crash_backoff
        c.crash_backoff = self._ctx.crash_backoff.next(c.crash_backoff)
        c.next_start = now + delay
        c.reason, c.message = "ContainerCreating", ""
        if delay > 0:
            c.reason = "CrashLoopBackOff"
            c.message = f"back-off {delay:.0f}s restarting failed container={c.name} pod={self.name}_{self.namespace}({self.uid})"
            self._ctx.events.warning(
                pod, "BackOff", f"Back-off restarting failed container {c.name} in pod {self.name}_{self.namespace}({self.uid})",
                field_path=container_field(c.name, c.init),
            )  # fmt: skip

    @staticmethod
    def _record_exit(c: Container, process: ContainerProcess) -> st.Terminated:
        c.process = None
        c.kill_deadline = None
        c.stop_probers()
        c.ready = c.started = c.startup_passed = False
        return terminated_run(process)

    # ---- probes ------------------------------------------------------------------------

    def _start_probers(self, c: Container, startup: bool) -> None:
        process = c.process
        assert process is not None
        if c.init:
            c.started = True
            return
        target = ProbeTarget(process.pid, c.launch_env, c.launch_cwd)
        if startup and c.spec.get("startupProbe"):
            c.probers.append(Prober("startup", c.spec["startupProbe"], c.spec, target, self._on_startup(c)))
            return
        c.started = True
        if c.spec.get("readinessProbe"):
            c.probers.append(
                Prober("readiness", c.spec["readinessProbe"], c.spec, target, self._on_readiness(c))
            )
        else:
            c.ready = not c.init
        if c.spec.get("livenessProbe"):
            c.probers.append(
                Prober("liveness", c.spec["livenessProbe"], c.spec, target, self._on_liveness(c))
            )

    def _on_startup(self, c: Container) -> Callable[[bool, str], None]:
        def changed(ok: bool, message: str) -> None:
            if ok:
                c.startup_passed = True
            else:
                c.probe_failure = f"Startup probe failed: {message}"
            self._wake.set()

        return changed

    def _on_readiness(self, c: Container) -> Callable[[bool, str], None]:
        def changed(ok: bool, message: str) -> None:
            c.ready = ok
            if not ok:
                self._ctx.events.warning(
                    self._current(), "Unhealthy", f"Readiness probe failed: {message}",
                    field_path=container_field(c.name, c.init),
                )  # fmt: skip
            self._wake.set()

        return changed

    def _on_liveness(self, c: Container) -> Callable[[bool, str], None]:
        def changed(ok: bool, message: str) -> None:
            if not ok:
                c.probe_failure = f"Liveness probe failed: {message}"
                self._wake.set()

        return changed

    def _handle_probes(self, c: Container, now: float) -> None:
        if c.process is None:
            return
        if c.startup_passed and not c.started:
            c.stop_probers()
            self._start_probers(c, startup=False)
        if c.probe_failure and c.kill_deadline is None:
            pod = self._current()
            field_path = container_field(c.name, c.init)
            self._ctx.events.warning(pod, "Unhealthy", c.probe_failure, field_path=field_path)
            kind = c.probe_failure.split()[0].lower()
            message = f"Container {c.name} failed {kind} probe, will be restarted"
            self._ctx.events.normal(pod, "Killing", message, field_path=field_path)
            c.probe_failure = None
            c.stop_probers()
            c.ready = False
            c.process.terminate()
            c.kill_deadline = now + self._grace_seconds()

    # ---- deletion ----------------------------------------------------------------------

    def _grace_seconds(self) -> float:
        pod = self._current()
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
        return float(grace)

    def _terminate(self) -> None:
        """Graceful deletion: SIGTERM, grace period, SIGKILL; final status; then remove the pod."""
        self._deleting = True
        pod = self._current()
        running = [c for c in self._init + self._containers if c.process is not None]
        log.info("deleted: stopping %d containers (grace %.0fs)", len(running), self._grace_seconds())
        for c in running:
            self._ctx.events.normal(
                pod, "Killing", f"Stopping container {c.name}", field_path=container_field(c.name, c.init)
            )
        self._stop_everything(self._grace_seconds())
        for c in running:
            assert c.process is not None
            c.terminated = self._record_exit(c, c.process)
        try:
            self._report_status(final=True)
            self._ctx.api.delete(pod_path(self.namespace, self.name), _delete_now(self.uid))
        except (ApiError, PodGone) as e:
            if not isinstance(e, PodGone) and e.status not in (404, 409):
                log.warning("pod %s/%s: final delete failed: %s", self.namespace, self.name, e)
        self.remove_folders()

    def _stop_everything(self, grace: float) -> None:
        """preStop hooks, SIGTERM to each main process, SIGKILL to the groups at the deadline;
        all within the grace period, containers in parallel."""
        deadline = time.monotonic() + grace
        running = [c for c in self._init + self._containers if c.process is not None]
        for c in running:
            c.stop_probers()
        self._run_pre_stop_hooks(running, deadline)
        for c in running:
            assert c.process is not None
            c.process.terminate()
        for c in running:
            assert c.process is not None
            if not c.process.wait(max(0.0, deadline - time.monotonic())):
                c.process.kill()
        for c in running:
            assert c.process is not None
            c.process.wait(10.0)

    def _run_pre_stop_hooks(self, running: list[Container], deadline: float) -> None:
        hooks = []
        for c in running:
            hook = (c.spec.get("lifecycle") or {}).get("preStop")
            if hook and c.process is not None:
                target = ProbeTarget(c.process.pid, c.launch_env, c.launch_cwd)
                thread = threading.Thread(
                    target=_run_hook, args=(hook, c.spec, target, deadline), daemon=True
                )
                thread.start()
                hooks.append(thread)
        for thread in hooks:
            thread.join(max(0.0, deadline - time.monotonic()))

    def remove_folders(self) -> None:
        remove_pod_folder(self._ctx, self.uid)

    # ---- status ------------------------------------------------------------------------

    def _views(self, init: bool) -> list[st.ContainerView]:
        return [c.view() for c in (self._init if init else self._containers)]

    def _report_status(self, final: bool = False) -> None:
        pod = self._current()
        in_api = pod.get("status") or {}
        # What we wrote last is newer than what the watch may have shown us so far.
        previous = self._reported or in_api
        status = st.pod_status(
            self._restart_policy,
            self._views(True),
            self._views(False),
            previous,
            self._start_time,
            time.time(),
        )
        if final and status["phase"] not in ("Succeeded", "Failed"):
            # A deleted pod ends in a terminal phase (kubelet does this since 1.27).
            all_ok = all(c.succeeded for c in self._containers)
            status["phase"] = "Succeeded" if all_ok else "Failed"
        status["conditions"] += [
            c for c in in_api.get("conditions") or () if c["type"] not in _OWN_CONDITIONS
        ]
        if status == self._reported or (not final and time.time() < self._report_at):
            return
        try:
            # A merge patch without resourceVersion: nothing to conflict with, so no
            # re-read and retry; the uid makes sure it only lands on this pod.
            self._ctx.api.patch(
                pod_path(self.namespace, self.name, "status"),
                {"metadata": {"uid": self.uid}, "status": status},
            )
        except ApiError as e:
            # 422 on metadata.uid: a new pod of the same name replaced ours.
            if e.status in (404, 409) or (e.status == 422 and "metadata.uid" in str(e)):
                raise PodGone() from e
            log.warning("pod %s/%s: status update failed, will retry: %s", self.namespace, self.name, e)
            self._report_at = time.time() + STATUS_RETRY_SECONDS
            return
        self._reported = status

    # ---- after an agent restart --------------------------------------------------------

    def _restore_from_status(self) -> None:
        """Containers the API says were started no longer exist (the agent stopped them
        when it went down): report them as kubelet reports containers it cannot find."""
        status = self._current().get("status") or {}
        for key, containers in (
            ("initContainerStatuses", self._init),
            ("containerStatuses", self._containers),
        ):
            previous = {s["name"]: s for s in status.get(key) or ()}
            for c in containers:
                if c.name in previous:
                    restore_container(c, previous[c.name], self._restart_policy)


def remove_pod_folder(ctx: PodContext, uid: str) -> None:
    """The pod's volumes (emptyDir, configMap...) go with it; logs and PVC folders stay."""
    shutil.rmtree(ctx.pods_dir / uid, ignore_errors=True)


_OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")


def _run_hook(hook: JsonDict, container: JsonDict, target: ProbeTarget, deadline: float) -> None:
    """A preStop hook: exec or httpGet (as a probe would run them) or sleep."""
    remaining = max(0.0, deadline - time.monotonic())
    if "sleep" in hook:
        time.sleep(min(remaining, float(hook["sleep"].get("seconds", 0))))
        return
    ok, message = check(hook, container, target, remaining)
    if not ok:
        log.info("preStop hook of %s failed: %s", container["name"], message)


def _token_lifetime(answer: JsonDict, requested: int) -> float:
    expires = answer.get("status", {}).get("expirationTimestamp")
    parsed = parse_time(expires) if expires else None
    return max(60.0, (parsed - time.time()) if parsed else float(requested))


def _delete_now(uid: str) -> JsonDict:
    return {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": uid},
    }
