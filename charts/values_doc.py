"""The values table of a chart's README, from the `# --` comments of its values.yaml (the
helm-docs convention, without helm-docs).

    python charts/values_doc.py charts/persistent-pipelines           # rewrite the table
    python charts/values_doc.py charts/persistent-pipelines --check   # fail if it is stale

A `# --` comment (continued by the `#` lines under it) documents the key right below it;
a documented key is a leaf of the table even when its default is a map or a list. Every
key is either documented or a map whose keys are.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BEGIN, END = "<!-- values:begin -->", "<!-- values:end -->"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?P<rest>.*)$")


@dataclass(frozen=True)
class Value:
    path: str
    default: Any
    description: str


class Undocumented(Exception):
    """A key of values.yaml that is neither documented nor a map of documented keys."""


def documented_values(values_yaml: str) -> list[Value]:
    defaults = yaml.safe_load(values_yaml) or {}
    found: list[Value] = []
    parents: list[tuple[int, str]] = []
    comment: list[str] | None = None
    skip_below: int | None = None
    for line in values_yaml.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment = [stripped.removeprefix("# --").strip()]
            continue
        if stripped.startswith("#") and comment is not None:
            comment.append(stripped.lstrip("#").strip())
            continue
        match = _KEY.match(line)
        if not match:
            if not stripped:
                comment = None
            continue
        indent = len(match["indent"])
        if skip_below is not None and indent > skip_below:
            continue  # inside a documented map: its default, not keys of the chart
        skip_below = None
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = ".".join([p for _, p in parents] + [match["key"]])
        default = _lookup(defaults, path)
        if comment is not None:
            found.append(Value(path, default, " ".join(comment)))
            skip_below = indent
        elif not isinstance(default, dict) or not default:
            raise Undocumented(f"{path} has no `# --` comment")
        else:
            parents.append((indent, match["key"]))
        comment = None
    return found


def _lookup(tree: Any, path: str) -> Any:
    for part in path.split("."):
        tree = tree[part]
    return tree


def table(values: list[Value]) -> str:
    rows = ["| Key | Default | Description |", "| --- | --- | --- |"]
    for value in values:
        default = json.dumps(value.default, separators=(",", ":"))
        rows.append(f"| `{value.path}` | `{default}` | {value.description} |")
    return "\n".join(rows)


def render(readme: str, values: list[Value]) -> str:
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table(values)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chart", type=Path)
    parser.add_argument("--check", action="store_true", help="fail if README.md's table is stale")
    options = parser.parse_args(argv)
    readme_path = options.chart / "README.md"
    readme = readme_path.read_text()
    wanted = render(readme, documented_values((options.chart / "values.yaml").read_text()))
    if options.check:
        if wanted != readme:
            print(f"{readme_path}: the values table is stale; run make chart-docs", file=sys.stderr)
            return 1
        return 0
    readme_path.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
