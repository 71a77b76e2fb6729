"""Log tails and following, process identity, watch errors."""

import os
import socket
from pathlib import Path

import pytest

from localcluster import procs
from localcluster.kubeapi import ApiError, WatchExpired, checked_event
from localcluster.kubelet.logs import stream_log, tail_offset


@pytest.mark.parametrize(
    ("content", "lines", "tail"),
    [
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc", 2, b"b\nc"),
        (b"a\nb\nc\n", 10, b"a\nb\nc\n"),
        (b"a\nb\nc\n", 0, b""),
        (b"", 3, b""),
    ],
)
def test_tail_offset(tmp_path: Path, content: bytes, lines: int, tail: bytes) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(content)
    assert content[tail_offset(path, lines) :] == tail


def test_tail_offset_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(1000)))
    assert path.read_bytes()[tail_offset(path, 3, block=16) :] == b"line 997\nline 998\nline 999\n"


def test_stream_log_limits_bytes_and_follows_until_the_run_ends(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(b"hello\n")
    chunks = stream_log(path, tail_lines=None, limit_bytes=3, follow=False, still_running=lambda: False)
    assert b"".join(chunks) == b"hel"
    writes = iter([b"more\n", b""])

    def still_running() -> bool:
        data = next(writes)
        with open(path, "ab") as f:
            f.write(data)
        return bool(data)

    chunks = stream_log(path, tail_lines=None, limit_bytes=None, follow=True, still_running=still_running)
    assert b"".join(chunks) == b"hello\nmore\n"


def test_start_ticks_survive_odd_command_names() -> None:
    line = "123 (a) b (c)) S 1 123 123 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 50"
    assert procs.parse_start_ticks(line) == 98765


def test_a_record_matches_only_the_same_process() -> None:
    record = procs.ProcessRecord.of(os.getpid())
    assert procs.is_alive(record)
    assert not procs.is_alive(procs.ProcessRecord(os.getpid(), record.start_ticks + 1))


def test_watch_errors_are_told_apart() -> None:
    gone = {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
    }
    with pytest.raises(WatchExpired):
        checked_event(gone, "/api/v1/pods")
    forbidden = {"type": "ERROR", "object": {"kind": "Status", "code": 403, "reason": "Forbidden"}}
    with pytest.raises(ApiError) as error:
        checked_event(forbidden, "/api/v1/pods")
    assert error.value.status == 403 and error.value.reason == "Forbidden"
    event = {"type": "MODIFIED", "object": {}}
    assert checked_event(event, "/api/v1/pods") is event


def test_a_free_port_is_outside_the_range_that_binds_to_port_zero_draw_from() -> None:
    # A port from that range can be given to any other process's bind to port 0 (a Spark
    # JVM's, a Python worker's) between the choice and the server's own bind.
    first, last = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [procs.free_port() for _ in range(50)]
    assert [p for p in ports if first <= p <= last] == []
    assert len(set(ports)) == 50, "a port was handed out twice"
    with socket.socket() as server:  # and it is free to listen on
        server.bind(("127.0.0.1", ports[-1]))
        server.listen()
        assert procs.free_port() != ports[-1]


def test_servers_listen_below_the_ephemeral_range_or_above_it_when_there_is_no_room() -> None:
    assert procs.listen_ports((32768, 60999)) == range(procs.LISTEN_PORTS_FROM, 32768)
    assert procs.listen_ports((10000, 60999)) == range(61000, 65536)
    assert procs.listen_ports((1024, 65535)) is None
