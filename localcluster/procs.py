"""Starting and stopping background processes by their recorded process id.

A pid alone is not an identity: after a reboot or a long time the number may belong to
another process. A record therefore keeps the process start time from /proc/<pid>/stat
too, and a process is only signalled if both still match. Nothing here looks processes up
by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProcessRecord:
    """A process we started: its pid and the kernel's start time of that pid."""

    pid: int
    start_ticks: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRecord:
        return cls(pid=int(data["pid"]), start_ticks=int(data["start_ticks"]))

    @classmethod
    def of(cls, pid: int) -> ProcessRecord:
        ticks = start_ticks(pid)
        if ticks is None:
            raise ProcessLookupError(pid)
        return cls(pid, ticks)


def parse_start_ticks(stat_line: str) -> int:
    """Field 22 of /proc/<pid>/stat; the command name (field 2) may hold spaces and ')'."""
    after_name = stat_line[stat_line.rindex(")") + 2 :]
    # after_name starts at field 3 (state), so field 22 is at index 19.
    return int(after_name.split()[19])


def start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    if _is_zombie(stat):
        return None
    return parse_start_ticks(stat)


def _is_zombie(stat_line: str) -> bool:
    return stat_line[stat_line.rindex(")") + 2 :].startswith("Z")


def is_alive(record: ProcessRecord) -> bool:
    return start_ticks(record.pid) == record.start_ticks


def spawn(
    argv: Sequence[str],
    log_file: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Starts a daemon-like child in its own session, output appended to log_file.

    Its own session: Ctrl-C in the terminal that ran `up` must not reach the cluster.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    return proc, ProcessRecord.of(proc.pid)


def stop(record: ProcessRecord, grace_seconds: float, *, poll: float = 0.05) -> bool:
    """SIGTERM, wait up to grace_seconds, then SIGKILL. Returns True if it had to kill."""
    if not _signal(record, signal.SIGTERM):
        return False
    if _wait_gone(record, grace_seconds, poll):
        return False
    _signal(record, signal.SIGKILL)
    _wait_gone(record, 5.0, poll)
    return True


def _signal(record: ProcessRecord, sig: signal.Signals) -> bool:
    if not is_alive(record):
        return False
    try:
        os.kill(record.pid, sig)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(record: ProcessRecord, timeout: float, poll: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(record):
            _reap(record.pid)  # our child (started by this process): no zombie left behind
            return True
        time.sleep(poll)
    return not is_alive(record)


def _reap(pid: int) -> None:
    # Only our own children can be reaped; for others (a previous `up`) init does it.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the servers themselves do: a port whose old connections linger in TIME_WAIT
        # (our own health checks) is still free to listen on.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", avoid: frozenset[int] = frozenset()) -> int:
    """A port the kernel considers free now; there is a small race until the child binds it."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
        if port not in avoid:
            return port
