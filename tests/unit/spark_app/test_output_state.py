from __future__ import annotations

import json
import os
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_app.runtime.sinks.keyed_state import OutputState, Snapshotter, encode_key


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
    wanted = OutputSnapshot(batch=1, position=10, key="s/1.zst")
    held = threading.Event()
    original = state.snapshot_to

    def slow_copy(path: str, reader: object = None) -> None:
        held.wait(10)  # the copy begins only once the next batch has written and committed
        original(path, reader)  # type: ignore[arg-type]

    state.snapshot_to = slow_copy  # type: ignore[method-assign]
    assert snapshotter.start(state, storage, wanted)
    assert not snapshotter.start(state, storage, OutputSnapshot(2, 20, "s/2.zst")), "one at a time"
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
    restored.restore_from(storage, "s/1.zst")
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
    assert snapshotter.start(state, FilesystemStorage(blocker), OutputSnapshot(1, 0, "s/1.zst"))
    snapshotter.wait(10)
    assert snapshotter.finished() is None
    assert snapshotter.start(state, FilesystemStorage(tmp_path / "ok"), OutputSnapshot(2, 0, "s/2.zst"))
    snapshotter.wait(10)
    assert snapshotter.finished() == OutputSnapshot(2, 0, "s/2.zst")
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


def test_a_snapshot_is_stored_compressed_and_one_stored_whole_by_an_older_driver_still_restores(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from spark_app.runtime.sinks.base import snapshot_key
    from spark_app.state.records import OutputSnapshot
    from spark_app.storage import FilesystemStorage

    storage = FilesystemStorage(tmp_path / "snapshots")
    state = OutputState(["k"])
    state.begin()
    state.upsert((f'["{i:06d}"]', f'{{"k":"{i:06d}","n":{i % 7}}}') for i in range(20_000))
    state.commit()
    key = snapshot_key("out", 3, 2)
    snapshotter = Snapshotter("out")
    assert snapshotter.start(state, storage, OutputSnapshot(3, 0, key))
    snapshotter.wait(10)
    assert snapshotter.finished() == OutputSnapshot(3, 0, key)
    stored = (tmp_path / "snapshots" / key).read_bytes()
    whole = tmp_path / "whole.sqlite"
    state.snapshot_to(str(whole))
    assert stored[:4] == b"\x28\xb5\x2f\xfd", "a zstd frame"
    assert len(stored) * 5 < whole.stat().st_size
    restored = OutputState(["k"])
    restored.restore_from(storage, key)
    assert len(restored) == 20_000 and restored.lookup(['["000009"]']) == {'["000009"]': '{"k":"000009","n":2}'}
    assert not [name for name in os.listdir(restored.folder) if name.startswith("restoring")], "the download is gone"

    # A snapshot an older driver stored whole (its key ends in .sqlite) is read as it is.
    storage.write_file("outputs/out/snapshots/000000000001-e000001.sqlite", str(whole))
    older = OutputState(["k"])
    older.restore_from(storage, "outputs/out/snapshots/000000000001-e000001.sqlite")
    assert len(older) == 20_000
    with pytest.raises(ValueError, match="must end in .zst"):
        snapshotter.start(state, storage, OutputSnapshot(4, 0, "outputs/out/snapshots/4.sqlite"))
    for opened in (state, restored, older):
        opened.close()


_KEY_VALUES = st.one_of(st.text(max_size=6), st.integers(-10**20, 10**20), st.none(), st.booleans(),
                        st.floats(allow_nan=False, allow_infinity=False))


@given(st.lists(st.tuples(st.lists(_KEY_VALUES, min_size=1, max_size=2), st.text(max_size=4),
                          st.integers(0, 3), st.sampled_from([1, -1])), max_size=40),
       st.integers(1, 5))
def test_a_replay_folds_into_what_each_line_says_whatever_the_keys_and_the_blocks(
        changes: list[tuple[list[object], str, int, int]], block: int) -> None:
    """Against the plain fold: each line parsed whole, its key encoded by the JSON encoder,
    its row as encoded before its time and diff were appended; the last line of a key wins.
    Written a few keys at a time (``block``), so that several blocks are sorted and written."""
    from spark_app.runtime.sinks import keyed_state
    from spark_app.runtime.sinks.changelog import line

    encoder = json.JSONEncoder(separators=(",", ":"), default=str)
    columns = ["k0", "k1"]
    lines, expected = [], {}
    for values, text, time_ms, diff in changes:
        record = {c: v for c, v in zip(columns, values, strict=False)} | {"text": text}
        row = json.dumps(record, separators=(",", ":"))
        lines.append(line(row, time_ms, diff).encode())
        expected[encoder.encode([record.get(c) for c in columns])] = row if diff > 0 else None
    state = OutputState(columns)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(keyed_state, "_REPLAY_BLOCK", block)
            assert state.apply_changelog(lines) == len(lines)
        assert state.lookup(expected) == {k: row for k, row in expected.items() if row is not None}
        assert len(state) == sum(row is not None for row in expected.values())
    finally:
        state.close()


@given(st.lists(_KEY_VALUES, min_size=1, max_size=3))
def test_a_key_is_the_json_encoders_text_of_its_values(values: list[object]) -> None:
    assert encode_key(values) == json.JSONEncoder(separators=(",", ":"), default=str).encode(values)
