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


def test_a_source_without_an_offset_yet_keeps_its_place_before_a_jvm_source():
    # A file source that has no offset yet ("-") before a Kafka source: the Kafka offset is
    # the second source's, not the first's.
    kafka = json.dumps({"orders": {"0": 42}})
    assert offsets_by_source("q", ("words", "orders"), ["-", kafka]) == {"orders": {"orders": {"0": 42}}}


def test_offsets_of_several_jvm_sources_go_to_them_in_spark_order():
    lines = [json.dumps({"a": {"0": 1}}), json.dumps({"source": "files", "files": 2}), json.dumps({"b": {"0": 3}})]
    assert offsets_by_source("q", ("kafka_a", "files", "kafka_b"), lines) == {
        "kafka_a": {"a": {"0": 1}}, "files": {"source": "files", "files": 2}, "kafka_b": {"b": {"0": 3}}}


def test_a_dash_of_a_named_sources_other_relation_does_not_shift_the_jvm_offsets():
    edges = json.dumps({"source": "edges", "files": 4})
    lines = [edges, "-", json.dumps({"t": {"0": 5}})]
    assert offsets_by_source("q", ("edges", "topic"), lines) == {"edges": {"source": "edges", "files": 4},
                                                                  "topic": {"t": {"0": 5}}}
