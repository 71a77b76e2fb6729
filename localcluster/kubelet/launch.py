"""From a pod's container spec to the exact process to start. Pure.

Processes run as root on the host, in the host network; the container's view differs
from the host's only by its bind mounts, and by a read-only root when its securityContext
asks for readOnlyRootFilesystem. Defaults that would touch the host's own
folders are moved into the pod's folder: the working directory defaults to a private
folder of the container rather than `/`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster.kubelet.envvars import expand
from localcluster.kubelet.hosts import HOSTS_PATH
from localcluster.kubelet.images import ImageConfig, compose_argv
from localcluster.kubelet.volumes import Mount, VolumePlan, plan_mounts

JsonDict = dict[str, Any]

# Docker's default PATH for images that set none.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host variables a container inherits: what host binaries (java, locales) need to work, and
# the node's JVM options, as a node image would set them (make test's TEST_JVM, whose
# comment in the Makefile gives the figures).
HOST_PASSTHROUGH = ("JAVA_HOME", "JAVA_TOOL_OPTIONS", "LANG", "LC_ALL", "TZ")
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"


@dataclass(frozen=True)
class LaunchSpec:
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    mounts: Sequence[Mount]
    log_path: Path
    work_dir: Path
    """A private folder of this container on the host: plan and pid files."""
    termination_file: Path | None = None
    """The host file bind-mounted at the container's terminationMessagePath (emptied at
    each start), or None when the container sets an empty path."""
    termination_policy: str = "File"
    """terminationMessagePolicy: File, or FallbackToLogsOnError."""
    read_only_root: bool = False
    """securityContext.readOnlyRootFilesystem: the container sees the host's filesystem
    read-only, except its volumes and the host's own other mounts (/dev, /dev/shm, /proc)."""


def pod_log_dir(root: Path, namespace: str, pod: str, uid: str) -> Path:
    """As kubelet's /var/log/pods/<namespace>_<pod>_<uid>."""
    return root / f"{namespace}_{pod}_{uid}"


def container_log(root: Path, namespace: str, pod: str, uid: str, container: str, restart: int) -> Path:
    """One file per run of the container: <container>/<restartCount>.log."""
    return pod_log_dir(root, namespace, pod, uid) / container / f"{restart}.log"


class LaunchError(Exception):
    """Kubelet's CreateContainerError."""


@dataclass(frozen=True)
class PodPaths:
    pod_dir: Path
    """.cache/cluster/pods/<uid>"""
    logs_root: Path
    """.cache/cluster/logs/pods"""

    def container_dir(self, container: str) -> Path:
        return self.pod_dir / "containers" / container

    @property
    def hosts_file(self) -> Path:
        """The pod's /etc/hosts (kubelet/hosts.py), as kubelet's pods/<uid>/etc-hosts."""
        return self.pod_dir / "etc-hosts"


def base_env(pod: JsonDict, image: ImageConfig, host_env: Mapping[str, str]) -> list[tuple[str, str]]:
    """What a process sees before the pod's own env: Docker's defaults and the image's ENV."""
    env = [("PATH", DEFAULT_PATH), ("HOSTNAME", pod["metadata"]["name"]), ("HOME", "/root")]
    env += [(k, host_env[k]) for k in HOST_PASSTHROUGH if k in host_env]
    return env + list(image.env)


def build_launch(
    pod: JsonDict,
    container: JsonDict,
    image: ImageConfig,
    env: Mapping[str, str],
    volumes: Mapping[str, VolumePlan],
    paths: PodPaths,
    restart_count: int,
) -> LaunchSpec:
    argv = compose_argv(image, container.get("command"), container.get("args"))
    argv = [expand(a, env) for a in argv]
    if not argv:
        raise LaunchError(f'no command specified for container "{container["name"]}" and its image has none')
    meta = pod["metadata"]
    work_dir = paths.container_dir(container["name"])
    cwd = container.get("workingDir") or image.working_dir or str(work_dir / "root")
    mounts = plan_mounts(container, volumes, env)
    termination_path = container.get("terminationMessagePath", DEFAULT_TERMINATION_MESSAGE_PATH)
    termination_file = work_dir / "termination-log" if termination_path else None
    if termination_file is not None:
        # As kubelet does: a file of the container's own at that path, so that processes
        # of different containers never share one (they all see the host's /dev).
        mounts = [*mounts, Mount(str(termination_file), termination_path, read_only=False)]
    if not any(m.target == HOSTS_PATH for m in mounts):
        # As kubelet does, unless the container mounts a file there itself.
        mounts = [*mounts, Mount(str(paths.hosts_file), HOSTS_PATH, read_only=False)]
    mounts.sort(key=lambda m: m.target.count("/"))
    return LaunchSpec(
        argv=argv,
        env=dict(env),
        cwd=cwd,
        mounts=mounts,
        log_path=container_log(
            paths.logs_root, meta["namespace"], meta["name"], meta["uid"], container["name"], restart_count
        ),
        work_dir=work_dir,
        termination_file=termination_file,
        termination_policy=container.get("terminationMessagePolicy") or "File",
        read_only_root=bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem")),
    )
