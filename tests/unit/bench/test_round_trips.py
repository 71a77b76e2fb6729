"""The resume benchmark's S3 round trips (bench/resume/round_trips.py): every answer of a
kept-alive connection waits the delay once, its body is passed whole, and each request is
logged with when it was sent and answered."""

import http.client
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.resume.round_trips import RoundTrips

DELAY_S = 0.2
BODY = b"x" * 300_000  # several reads of the proxy's buffer: only the first waits


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def do_PUT(self) -> None:  # noqa: N802
        length = int(self.headers["Content-Length"])
        received = self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", str(len(received)))
        self.end_headers()
        self.wfile.write(received)

    def log_message(self, *args: object) -> None:
        pass


def test_each_answer_of_a_kept_alive_connection_waits_one_round_trip(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log = tmp_path / "round-trips.log"
    proxy = RoundTrips(server.server_address[1], DELAY_S, log)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        took = []
        for method, path, body in [("GET", "/bucket/a", None), ("PUT", "/bucket/b", b"y" * 200_000),
                                   ("GET", "/bucket/c", None)]:
            began = time.monotonic()
            connection.request(method, path, body=body)
            answer = connection.getresponse().read()
            took.append(time.monotonic() - began)
            assert answer == (BODY if method == "GET" else body)
        connection.close()
    finally:
        proxy.stop()
        server.shutdown()
    assert all(DELAY_S <= seconds < 4 * DELAY_S for seconds in took), took
    lines = log.read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "GET /bucket/a HTTP/1.1", "PUT /bucket/b HTTP/1.1", "GET /bucket/c HTTP/1.1"]
    for line in lines:
        sent, answered = (float(t) for t in line.split(" ", 2)[:2])
        assert answered - sent >= DELAY_S


def test_a_body_sent_after_a_100_continue_is_not_taken_for_a_request(tmp_path: Path) -> None:
    """S3A's uploads ask `Expect: 100-continue`: the body follows the interim answer, and
    a body that starts with capitals (a CSV's header, an LZ4 block) was logged as a request."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log = tmp_path / "round-trips.log"
    proxy = RoundTrips(server.server_address[1], 0.0, log)
    body = b"LZ4Block,KEY\r\nA,1\r\n" * 100
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
            client.sendall(b"PUT /bucket/d HTTP/1.1\r\nHost: s3\r\nExpect: 100-continue\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(body))
            assert client.recv(1 << 16).startswith(b"HTTP/1.1 100")
            client.sendall(body)
            answer = b""
            while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < len(body):
                answer += client.recv(1 << 16)
    finally:
        proxy.stop()
        server.shutdown()
    assert answer.split(b"\r\n\r\n", 1)[1] == body
    assert [line.split(" ", 2)[2] for line in log.read_text().splitlines()] == ["PUT /bucket/d HTTP/1.1"]
