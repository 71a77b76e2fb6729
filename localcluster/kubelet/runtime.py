"""One run of one container: a local process in its own session and mount namespace.

Like a container runtime: the main process is the process-group leader; signals for a
graceful stop go to it alone; when it exits, whatever is left of its group is killed
(the namespace's PID 1 dying takes the container with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from localcluster import container_init
from localcluster.kubelet.launch import LaunchSpec
from localcluster.kubelet.logs import tail_offset
from localcluster.kubelet.status import (
    FALLBACK_LOG_BYTES,
    FALLBACK_LOG_LINES,
    MAX_TERMINATION_MESSAGE_BYTES,
    exit_code_of,
    termination_message,
)
from localcluster.procs import ProcessRecord, start_ticks


def launch_plan(spec: LaunchSpec) -> dict[str, object]:
    """What container_init reads."""
    return {
        "argv": list(spec.argv),
        "env": dict(spec.env),
        "cwd": spec.cwd,
        "mounts": [{"source": m.source, "target": m.target, "read_only": m.read_only} for m in spec.mounts],
        "read_only_root": spec.read_only_root,
    }


class ContainerProcess:
    """Starts at construction; `on_exit` is called (from a helper thread) once it has exited."""

    def __init__(self, spec: LaunchSpec, python: str, on_exit: Callable[[], None]) -> None:
        self._on_exit = on_exit
        self._exited = threading.Event()
        self.created_at = time.time()
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.start_error: str | None = None
        self.termination_message = ""
        """What the run left at its terminationMessagePath (or its log's tail), once it exited."""
        self._spec = spec
        self._proc, status_read = self._spawn(spec, python)
        self.pid = self._proc.pid
        self._pid_file = spec.work_dir / "pid"
        _record_pid(self._pid_file, self.pid)
        threading.Thread(
            target=self._watch, args=(status_read,), name=f"wait-{self.pid}", daemon=True
        ).start()

    @staticmethod
    def _spawn(spec: LaunchSpec, python: str) -> tuple[subprocess.Popen[bytes], int]:
        spec.work_dir.mkdir(parents=True, exist_ok=True)
        if spec.cwd.startswith(str(spec.work_dir)):
            Path(spec.cwd).mkdir(parents=True, exist_ok=True)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        if spec.termination_file is not None:
            spec.termination_file.write_bytes(b"")  # each run starts with an empty message
        plan_file = spec.work_dir / "plan.json"
        fd = os.open(plan_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(launch_plan(spec), f)
        status_read, status_write = os.pipe()
        argv = [python, "-S", "-E", container_init.__file__, str(plan_file), str(status_write)]
        try:
            with open(spec.log_path, "ab") as log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(status_write,),
                    start_new_session=True,
                    env={},
                    cwd="/",
                )
        finally:
            os.close(status_write)
        return proc, status_read

    def _watch(self, status_read: int) -> None:
        with os.fdopen(status_read, "rb") as status:
            error = status.read()  # EOF at exec (close-on-exec) or after a start error
        if error:
            self.start_error = error.decode(errors="replace")
        else:
            self.started_at = time.time()
        # Wait without reaping: while the zombie holds the pid, no other process can get
        # it, so killing the group by that number cannot hit a stranger.
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        self._kill_group()
        self.exit_code, self.signal = exit_code_of(self._proc.wait())
        self.finished_at = time.time()
        self.termination_message = self._read_termination_message(self.exit_code)
        self._pid_file.unlink(missing_ok=True)
        self._exited.set()
        self._on_exit()

    def _read_termination_message(self, exit_code: int) -> str:
        spec = self._spec
        if spec.termination_file is None:
            return ""
        written = _read_at_most(spec.termination_file, 0, MAX_TERMINATION_MESSAGE_BYTES)
        tail = b""
        if not written and spec.termination_policy == "FallbackToLogsOnError" and exit_code != 0:
            with contextlib.suppress(OSError):
                start = tail_offset(spec.log_path, FALLBACK_LOG_LINES)
                size = spec.log_path.stat().st_size
                tail = _read_at_most(spec.log_path, max(start, size - FALLBACK_LOG_BYTES), FALLBACK_LOG_BYTES)
        return termination_message(written, tail, spec.termination_policy, exit_code)

    @property
    def running(self) -> bool:
        return not self._exited.is_set()

    def wait(self, timeout: float | None) -> bool:
        return self._exited.wait(timeout)

    def terminate(self) -> None:
        """SIGTERM to the main process only, as Kubernetes does."""
        if self.running:
            _quietly(os.kill, self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the whole process group."""
        if self.running:
            self._kill_group()

    def stop(self, grace_seconds: float) -> None:
        self.terminate()
        if not self.wait(grace_seconds):
            self.kill()
            self.wait(10.0)

    def _kill_group(self) -> None:
        _quietly(os.killpg, self.pid, signal.SIGKILL)


def _quietly(fn: Callable[[int, int], None], pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        fn(pid, sig)


def _read_at_most(path: Path, offset: int, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except OSError:
        return b""


def _record_pid(path: Path, pid: int) -> None:
    ticks = start_ticks(pid)
    path.write_text(f"{pid} {ticks or 0}\n")


def kill_leftovers(pods_dir: Path) -> list[int]:
    """Kills container process groups a previous agent left (it crashed or was killed).

    Only groups whose recorded leader is still the same process (pid and start time)."""
    killed = []
    for pid_file in pods_dir.glob("*/containers/*/pid"):
        try:
            pid, ticks = (int(x) for x in pid_file.read_text().split())
        except (OSError, ValueError):
            continue
        record = ProcessRecord(pid, ticks)
        if start_ticks(record.pid) == record.start_ticks:
            _quietly(os.killpg, pid, signal.SIGKILL)
            killed.append(pid)
        pid_file.unlink(missing_ok=True)
    return killed
