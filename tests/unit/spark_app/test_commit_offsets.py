"""Spark's offset lines named by the query's sources, by position."""

import json

import pytest

from spark_app.runtime.commit import StateDamaged, offsets_by_source


def test_offsets_are_named_by_the_position_of_their_source():
    lines = [json.dumps({"source": "words", "files": 3}), json.dumps({"orders": {"0": 42, "1": 7}}), "-"]
    offsets = offsets_by_source("q", ("words", "orders", "later"), lines)
    assert offsets == {"words": {"source": "words", "files": 3}, "orders": {"orders": {"0": 42, "1": 7}}}


def test_an_offset_naming_another_source_is_refused():
    with pytest.raises(StateDamaged, match="offset of source 'b' where the query reads 'a'"):
        offsets_by_source("q", ("a", "b"), [json.dumps({"source": "b", "files": 1}), "-"])


def test_a_checkpoint_of_another_shape_is_refused():
    with pytest.raises(StateDamaged, match="has 1 sources where the query has 2"):
        offsets_by_source("q", ("a", "b"), [json.dumps({"source": "a", "files": 1})])
