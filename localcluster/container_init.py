"""Runs inside a new container process: enters a private mount namespace, binds the volumes,
then execs the container's command. The node agent starts it as

    python -S -E container_init.py PLAN_FILE STATUS_FD

in a new session (so the container is a process group of its own). PLAN_FILE is JSON:
{"argv": [...], "env": {...}, "cwd": "...", "mounts": [{"source", "target", "read_only"}]}.
It is deleted once read, since the environment may hold secrets. STATUS_FD is the write end
of a close-on-exec pipe: a successful exec closes it silently; a failure writes the reason
there, which the agent reports as a StartError.

Standard library only, and run with -S: it is on the path of every container start.
"""

from __future__ import annotations

import ctypes
import json
import os
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


def bind(source: str, target: str, read_only: bool) -> None:
    if not os.path.exists(source):
        raise FileNotFoundError(f"volume source {source} does not exist")
    _ensure_mount_point(target, is_dir=os.path.isdir(source))
    src, dst = os.fsencode(source), os.fsencode(target)
    _check(_libc.mount(src, dst, None, MS_BIND | MS_REC, None), f"bind {source} on {target}")
    if read_only:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        _check(_libc.mount(src, dst, None, flags, None), f"remount {target} read-only")


def _ensure_mount_point(target: str, is_dir: bool) -> None:
    # The mount namespace shares the host's filesystem: this creates the folder on the host.
    if is_dir:
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()


def run(plan: dict[str, object]) -> None:
    enter_private_mount_namespace()
    for mount in plan["mounts"]:  # type: ignore[attr-defined]
        bind(mount["source"], mount["target"], bool(mount["read_only"]))
    cwd = str(plan["cwd"])
    os.makedirs(cwd, exist_ok=True)
    os.chdir(cwd)
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
