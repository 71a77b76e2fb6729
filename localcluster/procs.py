"""Starting and stopping background processes by their recorded process id.

A pid alone is not an identity: after a reboot or a long time the number may belong to
another process. A record therefore keeps the process start time from /proc/<pid>/stat
too, and a process is only signalled if both still match. Nothing here looks processes up
by name.
"""

from __future__ import annotations

import contextlib
import os
import random
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


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS_FROM = 20000
"""The lowest port free_port hands out: above the usual services' ports."""
_handed_out: set[int] = set()


def listen_ports(ephemeral: tuple[int, int]) -> range | None:
    """Where a server of ours should listen, given the kernel's ephemeral range (first,
    last): below it if there is room, else above it; None if it covers every port."""
    first, last = ephemeral
    if first - LISTEN_PORTS_FROM >= 1000:
        return range(LISTEN_PORTS_FROM, first)
    if 65535 - last >= 1000:
        return range(last + 1, 65536)
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A port that nothing listens on now, for a server about to start, and never one this
    process handed out before.

    Not the kernel's answer to a bind to port 0: that port is free only until the probe
    closes, and every other bind to port 0 on the machine draws from the same ephemeral
    range (a PySpark driver's JVM binds one for each result it hands to Python: 27 in a
    session of 21 collects), each with about a 1 in 14,000 chance of being given that port,
    in the seconds before the server binds it; a test then waits for a server that exited
    with EADDRINUSE. Below that range only explicit binds go."""
    ports = listen_ports(_ephemeral_range())
    while True:
        port = random.choice(ports) if ports is not None else _kernel_port(host)
        if port not in _handed_out and port_is_free(port, host):
            _handed_out.add(port)
            return port


def _ephemeral_range() -> tuple[int, int]:
    try:
        first, last = EPHEMERAL_PORTS.read_text().split()
        return int(first), int(last)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
