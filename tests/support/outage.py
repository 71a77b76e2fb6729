"""A storage outage for the tests: a TCP proxy in front of the S3 server, run as a process
of its own, that is stopped (connections refused, as from a stopped server) and started
again on the same port. The server behind it keeps its data, which moto cannot across a
restart of its own.

    python -m tests.support.outage LISTEN_PORT TARGET_HOST TARGET_PORT
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from localcluster.procs import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Outage:
    """A proxy to ``target_url`` (http://host:port) on a loopback port of its own."""

    target_url: str
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Serving (again), on the same port."""
        target = urlparse(self.target_url)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.outage", str(self.port), target.hostname or "127.0.0.1",
                 str(target.port)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"the outage proxy did not listen on {self.port}: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        """The outage begins: every connection, open or new, fails."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _serve(port: int, host: str, target_port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port, reuse_address=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    listen, host, target = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    print(f"proxy pid {os.getpid()}: 127.0.0.1:{listen} -> {host}:{target}", flush=True)
    asyncio.run(_serve(listen, host, target))
