"""A TCP proxy on loopback that holds one request in flight: its client has sent it, the
server has not seen it. Put in front of the S3 server, it freezes a writer at the worst
moment of a put-if-absent race: after every check it makes, before its PUT lands."""

from __future__ import annotations

import socket
import threading
from types import TracebackType


class HoldingProxy:
    """Forwards 127.0.0.1:<port> to ``target`` byte for byte, except that the first chunk a
    client sends containing ``pattern`` (say, an HTTP request line) waits for ``release()``.
    ``held`` is set once that chunk has arrived."""

    def __init__(self, target: tuple[str, int], pattern: bytes) -> None:
        self._target = target
        self._pattern = pattern
        self._matched = False
        self._lock = threading.Lock()
        self._released = threading.Event()
        self.held = threading.Event()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets.append(self._listener)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        host, port = self._listener.getsockname()
        return f"http://{host}:{port}"

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._released.set()
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> HoldingProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        tail = b""  # the pattern may straddle two chunks
        try:
            while chunk := source.recv(65536):
                if from_client and self._pattern in tail + chunk and self._take_match():
                    self.held.set()
                    self._released.wait()
                tail = chunk[-len(self._pattern):]
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _take_match(self) -> bool:
        with self._lock:
            first, self._matched = not self._matched, True
            return first
