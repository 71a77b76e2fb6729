from __future__ import annotations

import json
import threading

from spark_app.runtime.sinks.keyed_state import OutputState, Snapshotter


def test_changelog_replay_rebuilds_the_state() -> None:
    state = OutputState(["word"])
    lines = [json.dumps(r).encode() for r in [
        {"word": "a", "count": 1, "time": 1, "diff": 1},
        {"word": "a", "count": 1, "time": 2, "diff": -1},
        {"word": "a", "count": 2, "time": 2, "diff": 1},
        {"word": "b", "count": 1, "time": 2, "diff": 1},
    ]]
    assert state.apply_changelog(lines) == 4
    assert len(state) == 2
    assert state.lookup([state.key_of({"word": "a"})]) == {'["a"]': '{"word":"a","count":2}'}


def test_a_snapshot_holds_the_state_of_its_commit_while_the_next_batches_write(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from spark_app.state.records import OutputSnapshot
    from spark_app.storage import FilesystemStorage

    storage = FilesystemStorage(tmp_path / "snapshots")
    state = OutputState(["k"])
    state.begin()
    state.upsert([('["x"]', '{"k":"x"}')])
    state.commit()
    snapshotter = Snapshotter("out")
    wanted = OutputSnapshot(batch=1, position=10, key="s/1")
    held = threading.Event()
    original = state.snapshot_to

    def slow_copy(path: str, reader: object = None) -> None:
        held.wait(10)  # the copy begins only once the next batch has written and committed
        original(path, reader)  # type: ignore[arg-type]

    state.snapshot_to = slow_copy  # type: ignore[method-assign]
    assert snapshotter.start(state, storage, wanted)
    assert not snapshotter.start(state, storage, OutputSnapshot(2, 20, "s/2")), "one at a time"
    assert snapshotter.finished() is None, "under way"
    state.begin()
    state.upsert([('["y"]', '{"k":"y"}')])
    state.delete(['["x"]'])
    state.commit()
    held.set()
    snapshotter.wait(10)
    assert snapshotter.finished() == wanted
    assert snapshotter.finished() is None, "handed over once"
    restored = OutputState(["k"])
    restored.restore_from(storage, "s/1")
    assert restored.lookup(['["x"]', '["y"]']) == {'["x"]': '{"k":"x"}'}
    assert len(state) == 1 and state.lookup(['["y"]']) == {'["y"]': '{"k":"y"}'}
    state.begin()
    state.upsert([('["z"]', '{"k":"z"}')])
    state.rollback()
    assert len(state) == 1
    state.close()
    restored.close()


def test_a_snapshot_that_cannot_be_stored_is_reported_and_the_next_one_is_taken(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from spark_app.state.records import OutputSnapshot
    from spark_app.storage import FilesystemStorage

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    state = OutputState(["k"])
    snapshotter = Snapshotter("out")
    assert snapshotter.start(state, FilesystemStorage(blocker), OutputSnapshot(1, 0, "s/1"))
    snapshotter.wait(10)
    assert snapshotter.finished() is None
    assert snapshotter.start(state, FilesystemStorage(tmp_path / "ok"), OutputSnapshot(2, 0, "s/2"))
    snapshotter.wait(10)
    assert snapshotter.finished() == OutputSnapshot(2, 0, "s/2")
    state.close()


def test_a_replay_keeps_each_row_as_it_was_encoded_and_the_last_change_of_a_key_wins() -> None:
    from spark_app.runtime.sinks.changelog import line

    rows = {
        "a": '{"k":"a","note":"x,\\"time\\":1","n":1.5}',  # a value that looks like the appended fields
        "b": '{"k":"b","text":"caf\\u00e9"}',
    }
    lines = [line(rows["a"], 1, 1), line(rows["b"], 1, 1), line(rows["b"], 2, -1),
             line('{"k":"b","text":"tea"}', 2, 1), line('{"k":"c"}', 2, 1), line('{"k":"c"}', 3, -1)]
    state = OutputState(["k"])
    assert state.apply_changelog(text.encode() for text in lines) == 6
    assert state.lookup(['["a"]', '["b"]', '["c"]']) == {'["a"]': rows["a"], '["b"]': '{"k":"b","text":"tea"}'}
    keyless = OutputState([])
    keyless.apply_changelog([line("{}", 5, 1).encode()])
    assert keyless.lookup(["[]"]) == {"[]": "{}"}
    state.close()
    keyless.close()

