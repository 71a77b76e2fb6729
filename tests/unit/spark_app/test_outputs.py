"""A JSON-lines output's recovery and copy, without Spark: what a superseded driver may
not do, and what the next driver finishes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_app.runtime.sinks.base import OutputContext, OutputDamaged
from spark_app.runtime.sinks.jsonlines import JsonLinesOutput
from spark_app.state.records import OutputHead, StagedBatch
from spark_app.state.session import Fenced
from spark_app.storage import FilesystemStorage, StorageUnavailable


def context(tmp_path: Path, epoch: int = 2, fenced: bool = False) -> OutputContext:
    def fence() -> None:
        if fenced:
            raise Fenced("driver epoch 1 was superseded")

    return OutputContext(epoch, "state", FilesystemStorage(tmp_path / "state"), fence)


def test_a_superseded_driver_recovering_late_changes_nothing(tmp_path: Path) -> None:
    """Frozen in its start-up: its head is older than what a newer driver has written since."""
    out = tmp_path / "out.jsonlines"
    out.write_bytes(b'{"a":1,"time":1,"diff":1}\n{"a":2,"time":2,"diff":1}\n')
    stale = JsonLinesOutput("out", str(out), None)
    with pytest.raises(Fenced):
        stale.recover(OutputHead(position=26, rows=1), context(tmp_path, epoch=1, fenced=True))
    assert out.read_bytes().count(b"\n") == 2


def test_the_next_driver_copies_in_a_batch_committed_but_not_copied(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonlines"
    out.write_bytes(b"line-0\n")
    pending = tmp_path / ".out.jsonlines.pending"
    pending.mkdir()
    (pending / "e000001-b000000000001.jsonl").write_bytes(b"line-1\n")
    head = OutputHead(position=14, rows=2, staged=StagedBatch("e000001-b000000000001.jsonl", 7))
    JsonLinesOutput("out", str(out), None).recover(head, context(tmp_path))
    assert out.read_bytes() == b"line-0\nline-1\n"
    assert [p.name for p in pending.iterdir()] == ["lock"]


def test_a_committed_batch_whose_stage_is_gone_is_damage_not_a_hole(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonlines"
    out.write_bytes(b"line-0\n")
    head = OutputHead(position=14, rows=2, staged=StagedBatch("e000001-b000000000001.jsonl", 7))
    with pytest.raises(OutputDamaged, match="lacks bytes 7 to 14"):
        JsonLinesOutput("out", str(out), None).recover(head, context(tmp_path))
    assert out.read_bytes() == b"line-0\n"


def held_restore(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Makes a keyed output's restore (a snapshot's download, a long replay) wait until the
    returned event is set."""
    release = threading.Event()
    original = JsonLinesOutput._rebuild_state

    def slow_rebuild(self: JsonLinesOutput, snapshots: FilesystemStorage) -> None:
        release.wait(30)
        original(self, snapshots)

    monkeypatch.setattr(JsonLinesOutput, "_rebuild_state", slow_rebuild)
    return release


def test_a_keyed_outputs_state_is_restored_beside_the_start_and_its_first_use_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state (a snapshot download and a changelog replay) is needed only once the first
    batch's rows are compared with it; the query starts meanwhile."""
    out = tmp_path / "out.jsonlines"
    out.write_bytes(b'{"a":1,"n":1,"time":1,"diff":1}\n')
    release = held_restore(monkeypatch)
    output = JsonLinesOutput("out", str(out), ["a"])
    recovering = threading.Thread(target=output.recover,
                                  args=(OutputHead(position=out.stat().st_size, rows=1), context(tmp_path)))
    recovering.start()
    recovering.join(5)
    assert not recovering.is_alive(), "recover waited for the state's restore"

    ready = threading.Thread(target=output._state_ready)
    ready.start()
    ready.join(0.5)
    assert ready.is_alive(), "the state was used before it was restored"
    release.set()
    ready.join(30)
    state = output._state_ready()
    assert state is not None and len(state) == 1
    output.close()


def test_a_snapshot_asked_for_while_the_state_is_restored_is_put_off_not_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver asks for snapshots between batches, holding the query's batch lock: had it
    waited there for a restore (a changelog replay of a million lines takes seconds), the
    first batch would have waited for the lock before Spark computed any of its rows."""
    out = tmp_path / "out.jsonlines"
    out.write_bytes(b'{"a":1,"n":1,"time":1,"diff":1}\n')
    release = held_restore(monkeypatch)
    output = JsonLinesOutput("out", str(out), ["a"])
    head = OutputHead(position=out.stat().st_size, rows=1)
    output.recover(head, context(tmp_path))
    storage = FilesystemStorage(tmp_path / "state")
    started: list[bool] = []
    asking = threading.Thread(target=lambda: started.append(output.start_snapshot(head, 0, storage)))
    asking.start()
    asking.join(5)
    assert not asking.is_alive(), "the snapshot waited for the state's restore"
    assert started == [False]  # not started: asked again after a later batch
    release.set()
    assert output._state_ready() is not None  # the first batch's use of it
    assert output.start_snapshot(head, 0, storage)
    output.wait_for_snapshot(30)
    stored = output.finished_snapshot(head)
    assert stored is not None and stored.snapshot is not None
    assert storage.list("outputs/out/snapshots/") == [stored.snapshot.key]
    output.close()


def test_the_first_batchs_rows_are_computed_while_the_state_is_restored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark computes a batch's rows when its chunks are first asked for; the restored state
    is needed only to compare them with: asked for first, the state held the whole batch
    back until a million-line replay was done (the job then ran after it, 7 s more)."""
    from spark_app.runtime.sinks import base
    from spark_app.runtime.sinks.base import Batch

    out = tmp_path / "out.jsonlines"
    out.write_bytes(b'{"a":"x","n":1,"time":1,"diff":1}\n')
    release, computed = held_restore(monkeypatch), threading.Event()

    def spark_job(df: object, time_ms: int, mode: str, key: object = None) -> Iterator[tuple[bytes, int]]:
        computed.set()  # the batch's one job: every chunk is ready once the first is
        yield b'["x"]\t{"a":"x","n":2}\n["y"]\t{"a":"y","n":1}\n', 2

    monkeypatch.setattr(base, "chunks", spark_job)
    output = JsonLinesOutput("out", str(out), ["a"])
    output.recover(OutputHead(position=out.stat().st_size, rows=1), context(tmp_path))
    heads: list[OutputHead] = []
    writing = threading.Thread(target=lambda: heads.append(output.write(Batch(1, 2, None))))  # type: ignore[arg-type]
    writing.start()
    assert computed.wait(5), "the batch's rows waited for the state's restore"
    assert writing.is_alive(), "the rows were compared before the state was restored"
    release.set()
    writing.join(30)
    assert heads and heads[0].rows == 4  # x retracted and updated, y inserted
    output.aborted()
    output.close()


def test_a_failed_restore_fails_every_use_of_the_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(self: JsonLinesOutput, snapshots: FilesystemStorage) -> None:
        raise StorageUnavailable("s3://bucket/state: connection refused")

    monkeypatch.setattr(JsonLinesOutput, "_rebuild_state", failing)
    out = tmp_path / "out.jsonlines"
    output = JsonLinesOutput("out", str(out), ["a"])
    output.recover(None, context(tmp_path))
    with pytest.raises(StorageUnavailable):
        output.aborted()
    with pytest.raises(StorageUnavailable):  # again: a half-restored state is never used
        output.start_snapshot(OutputHead(position=0, rows=0), 0, FilesystemStorage(tmp_path / "state"))
    output.close()
