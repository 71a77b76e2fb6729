"""The operator package's shape: handlers stay glue, and no module shadows the standard
library's `operator`. (Its layering is in pyproject.toml's import contracts: make lint.)"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
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


def test_running_the_operator_loads_nothing_of_the_runtime_but_its_contract() -> None:
    """What the import contracts cannot see: importing spark_app.contract runs the package's
    __init__, which must load nothing else (no storage, no boto3, no Spark)."""
    script = ("import json, sys, pipeline_operator.__main__, pipeline_operator.handlers; "
              "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('spark_app', 'boto3', 'botocore', 'pyspark', 'delta'))))")
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(loaded.stdout) == ["spark_app", "spark_app.contract"]
