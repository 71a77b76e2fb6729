"""Reading a streaming DataFrame's logical plan: its stateful operators and its output key.

Through py4j, on the analyzed plan. The signatures leave out expression ids and output
aliases, so renaming an aggregate's column or projecting differently after the state
does not change them, while a different key or aggregate function does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame

STATEFUL_NODES = {
    "Aggregate",
    "Deduplicate",
    "DeduplicateWithinWatermark",
    "Distinct",
    "FlatMapGroupsWithState",
    "FlatMapGroupsInPandasWithState",
    "TransformWithState",
    "TransformWithStateInPySpark",
    "Join",
    "GlobalLimit",
    "Sort",
}
_EXPR_ID = re.compile(r"#\d+L?")
_OBJECT_ID = re.compile(r"@[0-9a-f]{4,}")


class KeyNotInOutput(Exception):
    """The query aggregates by a key that its output does not keep."""


@dataclass(frozen=True)
class PlanFacts:
    stateful: tuple[str, ...]
    """One signature per stateful operator, top-down."""
    key: tuple[str, ...] | None
    """The output columns that identify a row (update mode), or None (append mode)."""

    @property
    def output_mode(self) -> str:
        return "update" if self.key is not None else "append"


def analyze(df: DataFrame) -> PlanFacts:
    root = df._jdf.queryExecution().analyzed()
    nodes = list(_walk(root))
    stateful = tuple(_signature(n) for n in nodes if _is_stateful(n))
    aggregate_path = _path_to(root, lambda n: n.nodeName() == "Aggregate" and n.isStreaming())
    if aggregate_path is None or _has_stream_join(nodes):
        return PlanFacts(stateful, None)
    return PlanFacts(stateful, _output_key(aggregate_path, df.columns))


def _walk(node: Any) -> Any:
    yield node
    for child in _children(node):
        yield from _walk(child)


def _children(node: Any) -> list[Any]:
    return _seq(node.children())


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def _is_stateful(node: Any) -> bool:
    name = node.nodeName()
    if name not in STATEFUL_NODES or not node.isStreaming():
        return False
    if name == "Join":
        return all(child.isStreaming() for child in _children(node))
    return True


def _has_stream_join(nodes: list[Any]) -> bool:
    return any(n.nodeName() == "Join" and _is_stateful(n) for n in nodes)


def _signature(node: Any) -> str:
    name = node.nodeName()
    if name == "Aggregate":
        keys = [f"{_clean(g.sql())}: {g.dataType().simpleString()}" for g in _seq(node.groupingExpressions())]
        functions = [
            _clean(_unalias(e).sql()) for e in _seq(node.aggregateExpressions()) if not _is_grouping(e, node)
        ]
        return f"Aggregate(keys=[{', '.join(keys)}], functions=[{', '.join(functions)}])"
    schema = ", ".join(f"{f.name()}: {f.dataType().simpleString()}" for f in _seq(node.schema().toSeq())) \
        if hasattr(node.schema(), "toSeq") else node.schema().simpleString()
    return f"{name}({_clean(node.simpleString(200))}; output {schema})"


def _unalias(expression: Any) -> Any:
    return expression.child() if expression.nodeName() == "Alias" else expression


def _is_grouping(expression: Any, aggregate: Any) -> bool:
    inner = _unalias(expression)
    return any(inner.semanticEquals(g) for g in _seq(aggregate.groupingExpressions()))


def _clean(text: str) -> str:
    return _OBJECT_ID.sub("", _EXPR_ID.sub("", text)).replace("`", "")


def _path_to(node: Any, predicate: Any) -> list[Any] | None:
    """Nodes from the root down to the first node matching ``predicate`` (pre-order)."""
    if predicate(node):
        return [node]
    for child in _children(node):
        path = _path_to(child, predicate)
        if path is not None:
            return [node, *path]
    return None


def _output_key(path: list[Any], columns: list[str]) -> tuple[str, ...]:
    aggregate = path[-1]
    key_ids = {
        e.exprId().id() for e in _seq(aggregate.aggregateExpressions()) if _is_grouping(e, aggregate)
    }
    wanted = len(_seq(aggregate.groupingExpressions()))
    for node in reversed(path[:-1]):
        if node.nodeName() != "Project":
            continue
        kept = set()
        for expression in _seq(node.projectList()):
            inner = _unalias(expression)
            if inner.nodeName() == "AttributeReference" and inner.exprId().id() in key_ids:
                kept.add(expression.exprId().id())
        key_ids = kept
    root = path[0]
    names = [a.name() for a in _seq(root.output()) if a.exprId().id() in key_ids]
    if len(names) < wanted:
        raise KeyNotInOutput(
            f"the output drops part of its aggregation key (keeps {names or 'none'} of {wanted} key "
            f"columns); keep every groupBy column in the output, or pass key=[...] to the output"
        )
    return tuple(n for n in columns if n in names)
