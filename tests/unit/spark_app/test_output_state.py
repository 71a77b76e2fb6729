from __future__ import annotations

import json

from spark_app.runtime.sinks.keyed_state import OutputState


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


def test_snapshot_restore_and_rollback() -> None:
    state = OutputState(["k"])
    state.begin()
    state.upsert([('["x"]', '{"k":"x"}')])
    state.commit()
    snapshot = state.snapshot()
    state.begin()
    state.upsert([('["y"]', '{"k":"y"}')])
    state.rollback()
    assert len(state) == 1
    other = OutputState(["k"])
    other.restore(snapshot)
    assert other.lookup(['["x"]']) == {'["x"]': '{"k":"x"}'}
    state.close()
    other.close()
