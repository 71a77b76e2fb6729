"""The operator package's shape: handlers stay glue, and no module shadows the standard
library's `operator`. (Its layering is in pyproject.toml's import contracts: make lint.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "operator" / "pipeline_operator"


def test_handlers_are_short() -> None:
    tree = ast.parse((PACKAGE / "handlers.py").read_text())
    lengths = {node.name: node.end_lineno - node.lineno + 1  # type: ignore[operator]
               for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    assert lengths and max(lengths.values()) <= 25, lengths


def test_no_module_named_operator_shadows_the_standard_library() -> None:
    import operator

    assert operator.__file__ is not None and "site-packages" not in operator.__file__
    assert not (ROOT / "operator" / "__init__.py").exists()
