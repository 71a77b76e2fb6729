"""Runs inside a new container process: enters a private mount namespace, binds the volumes,
then execs the container's command. The node agent starts it as

    python -S -E container_init.py PLAN_FILE STATUS_FD

in a new session (so the container is a process group of its own). PLAN_FILE is JSON:
{"argv": [...], "env": {...}, "cwd": "...", "mounts": [{"source", "target", "read_only"}],
"read_only_root": bool}.
It is deleted once read, since the environment may hold secrets. STATUS_FD is the write end
of a close-on-exec pipe: a successful exec closes it silently; a failure writes the reason
there, which the agent reports as a StartError.

Standard library only, and run with -S: it is on the path of every container start.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

# Exit status when we cannot start the command, like runc's.
START_ERROR_EXIT = 128

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def enter_private_mount_namespace() -> None:
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Private propagation: our bind mounts must not leak back to the host, nor the host's in.
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")


def open_sources(mounts: list[dict[str, object]]) -> list[int]:
    """Opens every source before the first mount: a mount at /work must not hide a later
    source under /work (the cluster's own folders live below the repository)."""
    fds = []
    for mount in mounts:
        source = str(mount["source"])
        if not os.path.exists(source):
            raise FileNotFoundError(f"volume source {source} does not exist")
        fds.append(os.open(source, os.O_PATH | os.O_CLOEXEC))
    return fds


def bind(source_fd: int, target: str, read_only: bool) -> None:
    _ensure_mount_point(target, is_dir=stat.S_ISDIR(os.fstat(source_fd).st_mode))
    src, dst = f"/proc/self/fd/{source_fd}".encode(), os.fsencode(target)
    _check(_libc.mount(src, dst, None, MS_BIND | MS_REC, None), f"bind on {target}")
    if read_only:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        _check(_libc.mount(None, dst, None, flags, None), f"remount {target} read-only")


def _ensure_mount_point(target: str, is_dir: bool) -> None:
    # The mount namespace shares the host's filesystem: this creates the folder on the host.
    if is_dir:
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()


def enter_working_dir(cwd: str, fd_before_mounts: int | None) -> None:
    """The path as the container sees it (it may be in a volume); if a mount hid it, the
    folder it named before the mounts (the default, private working directory)."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
    elif fd_before_mounts is not None:
        os.fchdir(fd_before_mounts)
    else:
        os.makedirs(cwd)
        os.chdir(cwd)


def run(plan: dict[str, object]) -> None:
    mounts: list[dict[str, object]] = plan["mounts"]  # type: ignore[assignment]
    # Sources are opened inside the new namespace: a bind mount's source must be a mount
    # of the caller's own namespace, and right after unshare the view is still the host's.
    enter_private_mount_namespace()
    sources = open_sources(mounts)
    cwd = str(plan["cwd"])
    cwd_fd = os.open(cwd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if os.path.isdir(cwd) else None
    for fd, mount in zip(sources, mounts, strict=True):
        bind(fd, str(mount["target"]), bool(mount["read_only"]))
        os.close(fd)
    if plan.get("read_only_root"):
        # readOnlyRootFilesystem: only this mount namespace's root turns read-only; the
        # volumes bound above are mounts of their own and stay writable, as do /dev/shm
        # and /proc, which the host mounts separately (as a container runtime does).
        _check(_libc.mount(None, b"/", None, MS_BIND | MS_REMOUNT | MS_RDONLY, None), "remount / read-only")
    enter_working_dir(cwd, cwd_fd)
    argv = [str(a) for a in plan["argv"]]  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in plan["env"].items()}  # type: ignore[attr-defined]
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        raise StartError(f'exec: "{argv[0]}": executable file not found in $PATH') from None
    except PermissionError:
        raise StartError(f'exec: "{argv[0]}": permission denied') from None


class StartError(Exception):
    """Why the command could not be started, in the words runc would use."""


def main() -> None:
    plan_file, status_fd = sys.argv[1], int(sys.argv[2])
    os.set_inheritable(status_fd, False)
    try:
        with open(plan_file) as f:
            plan = json.load(f)
        os.unlink(plan_file)
        run(plan)
    except BaseException as e:  # noqa: BLE001 - any failure before exec is a start error
        message = str(e) if isinstance(e, StartError) else f"{type(e).__name__}: {e}"
        os.write(status_fd, message.encode())
        os._exit(START_ERROR_EXIT)


if __name__ == "__main__":
    main()
