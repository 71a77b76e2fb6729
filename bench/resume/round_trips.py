"""A round trip per request in front of the local S3 server, as a real S3 has.

The local S3 server answers on loopback in a fraction of a millisecond, so a resume's
requests (about 200 at 1M keys) cost only the server's CPU there; on S3 each one waits a
network round trip and the service's first byte, 10 to 30 ms within a region. This proxy,
on loopback in a thread of the benchmark's process, holds back the first bytes of every
response by a fixed delay: one delay per exchange of an HTTP connection (a request and
its answer, and an `Expect: 100-continue`'s interim answer), none on the bytes that
follow. Bandwidth is not limited: the goal's allowance for the state's bytes is separate.
Each request's line and the moments it was sent and answered go to a log, to read which
requests a start waits for one after another.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path
from typing import IO

from localcluster.procs import free_port

_REQUEST_LINE = re.compile(rb"[A-Z]+ \S+ HTTP/1\.[01](?=\r\n)")


class RoundTrips:
    """Forwards 127.0.0.1:``port`` to the server at ``target_port``, each answer ``delay_s``
    late (a setting that may change between runs)."""

    def __init__(self, target_port: int, delay_s: float, log: Path) -> None:
        self.port = free_port()
        self._log: IO[str] = open(log, "a", buffering=1)  # noqa: SIM115 - closed in stop()
        self._target_port = target_port
        self.delay_s = delay_s
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="s3-round-trips", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise SystemExit("the S3 round-trip proxy did not start")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", self.port))
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()

    async def _connection(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        try:
            server_in, server_out = await asyncio.open_connection("127.0.0.1", self._target_port)
        except OSError:
            client_out.close()
            return
        # Set when the client has sent bytes that the server has not answered yet: the next
        # answer's first bytes wait the round trip.
        asked = asyncio.Event()

        sent: list[tuple[float, str]] = []

        async def requests() -> None:
            while data := await client_in.read(1 << 16):
                if not asked.is_set() and (line := _REQUEST_LINE.match(data)):  # not a body after a 100-continue
                    sent.append((time.time(), line.group(0).decode()))
                asked.set()
                server_out.write(data)
                await server_out.drain()
            server_out.close()

        async def answers() -> None:
            while data := await server_in.read(1 << 16):
                if asked.is_set():
                    asked.clear()
                    await asyncio.sleep(self.delay_s)
                    if sent:
                        began, line = sent.pop()
                        self._log.write(f"{began:.3f} {time.time():.3f} {line}\n")
                client_out.write(data)
                await client_out.drain()
            client_out.close()

        try:
            await asyncio.gather(requests(), answers())
        except (ConnectionError, OSError):
            client_out.close()
            server_out.close()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close_connections(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._log.close()

    async def _close_connections(self) -> None:
        """Ends the connections still open (a client's pool keeps them), so that none is
        left pending when the loop stops."""
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
