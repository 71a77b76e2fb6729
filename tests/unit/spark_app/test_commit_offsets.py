"""Spark's offset lines named by the query's sources, by position."""

import json

import pytest

from spark_app.runtime.commit import StateDamaged, offsets_by_source


def test_offsets_are_named_by_the_position_of_their_source():
    lines = [json.dumps({"source": "words", "files": 3}), json.dumps({"orders": {"0": 42, "1": 7}}), "-"]
    offsets = offsets_by_source("q", ("words", "orders", "later"), lines)
    assert offsets == {"words": {"source": "words", "files": 3}, "orders": {"orders": {"0": 42, "1": 7}}}


def test_several_relations_of_one_source_give_one_offset():
    line = json.dumps({"source": "edges", "files": 4})
    assert offsets_by_source("components", ("edges",), [line, line, line]) == {"edges": {"source": "edges", "files": 4}}


def test_an_offset_naming_a_source_the_query_does_not_read_is_refused():
    with pytest.raises(StateDamaged, match="offset of source 'c', which the query does not read"):
        offsets_by_source("q", ("a", "b"), [json.dumps({"source": "c", "files": 1}), "-"])


def test_more_offsets_without_a_name_than_such_sources_is_refused():
    with pytest.raises(StateDamaged, match="2 offsets of sources that do not name themselves, where the query has 1"):
        offsets_by_source("q", ("a", "b"), [json.dumps({"source": "a", "files": 1}), json.dumps({"t": {"0": 1}}),
                                            json.dumps({"u": {"0": 1}})])
