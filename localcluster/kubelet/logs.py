"""Container logs: where they are written, and the kubelet endpoint `kubectl logs` reaches.

Layout, as kubelet's /var/log/pods:
    .cache/cluster/logs/pods/<namespace>_<pod>_<uid>/<container>/<restartCount>.log
Each file holds the raw stdout and stderr of one run (no CRI timestamps, so
`kubectl logs --timestamps` and `--since` are not supported).

The server speaks HTTPS on 127.0.0.1 with a certificate of the cluster CA and requires a
client certificate of that CA (the apiserver's kubelet client certificate).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

FOLLOW_POLL_SECONDS = 0.1


def run_logs(container_dir: Path) -> list[Path]:
    """The log files of a container's runs, oldest first."""
    files = [p for p in container_dir.glob("*.log") if p.stem.isdigit()]
    return sorted(files, key=lambda p: int(p.stem))


def tail_offset(path: Path, lines: int, block: int = 65536) -> int:
    """The byte offset where the last `lines` lines of the file start."""
    size = path.stat().st_size
    if lines <= 0:
        return size
    with open(path, "rb") as f:
        position = size
        newlines = 0
        # A final newline ends the last line rather than starting an empty one.
        f.seek(max(size - 1, 0))
        skip_last = size > 0 and f.read(1) == b"\n"
        while position > 0:
            start = max(position - block, 0)
            f.seek(start)
            data = f.read(position - start)
            if skip_last and position == size:
                data = data[:-1]
            for index in range(len(data) - 1, -1, -1):
                if data[index] == 0x0A:
                    newlines += 1
                    if newlines == lines:
                        return start + index + 1
            position = start
    return 0


class LogLocator(Protocol):
    """What the server asks the node agent."""

    def container_log_dir(self, namespace: str, pod: str, container: str) -> Path | None: ...

    def is_running(self, namespace: str, pod: str, container: str) -> bool: ...


class LogRequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def open_log(locator: LogLocator, namespace: str, pod: str, container: str, previous: bool) -> Path:
    folder = locator.container_log_dir(namespace, pod, container)
    runs = run_logs(folder) if folder else []
    if previous:
        if len(runs) < 2:
            raise LogRequestError(
                400, f'previous terminated container "{container}" in pod "{pod}" not found'
            )
        return runs[-2]
    if not runs:
        raise LogRequestError(
            400, f'container "{container}" in pod "{pod}" is waiting to start: ContainerCreating'
        )
    return runs[-1]


def stream_log(
    path: Path,
    *,
    tail_lines: int | None,
    limit_bytes: int | None,
    follow: bool,
    still_running: Callable[[], bool],
) -> Iterator[bytes]:
    """Yields the log's bytes; with follow, keeps yielding until the run ends."""
    remaining = limit_bytes if limit_bytes is not None else -1
    draining = False
    with open(path, "rb") as f:
        if tail_lines is not None:
            f.seek(tail_offset(path, tail_lines))
        while remaining != 0:
            chunk = f.read(65536 if remaining < 0 else min(65536, remaining))
            if chunk:
                if remaining > 0:
                    remaining -= len(chunk)
                yield chunk
            elif draining or not follow:
                return
            elif not still_running():
                # Read to the end once more: its last words may have come just now.
                draining = True
            else:
                time.sleep(FOLLOW_POLL_SECONDS)


class _Handler(BaseHTTPRequestHandler):
    server: LogServer
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's naming
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        parts = url.path.strip("/").split("/")
        if url.path == "/healthz":
            self._reply(200, b"ok")
        elif len(parts) == 4 and parts[0] == "containerLogs":
            self._container_logs(parts[1], parts[2], parts[3], query)
        else:
            self._reply(404, b"not found: the local node agent serves /containerLogs and /healthz only")

    def _container_logs(self, namespace: str, pod: str, container: str, query: dict[str, str]) -> None:
        locator = self.server.locator
        follow = query.get("follow") in ("true", "1")
        try:
            path = open_log(locator, namespace, pod, container, query.get("previous") in ("true", "1"))
        except LogRequestError as e:
            self._reply(e.status, str(e).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        chunks = stream_log(
            path,
            tail_lines=_int(query.get("tailLines")),
            limit_bytes=_int(query.get("limitBytes")),
            follow=follow,
            still_running=lambda: locator.is_running(namespace, pod, container),
        )
        try:
            for chunk in chunks:
                self.wfile.write(chunk)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass  # the client went away (kubectl logs -f interrupted)

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("kubelet api: " + format, *args)


def _int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


class LogServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, locator: LogLocator, cert: Path, key: Path, client_ca: Path) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.locator = locator
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
        self._context.verify_mode = ssl.CERT_REQUIRED
        self._context.load_cert_chain(cert, key)

    def finish_request(self, request: socket.socket, client_address: tuple[str, int]) -> None:  # type: ignore[override]
        # The TLS handshake happens here, in the request's own thread, so that one slow or
        # bad client cannot stall the accept loop.
        try:
            tls = self._context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            log.info("kubelet api: TLS handshake with %s failed: %s", client_address, e)
            return
        super().finish_request(tls, client_address)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="kubelet-api", daemon=True)
        thread.start()
        return thread
