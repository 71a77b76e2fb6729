"""Rendering the chart with `helm template` (the project's helm, .cache/bin/helm)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.kubectl import KubeCommands

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "persistent-pipelines"
# No cluster: helm template and lint only read the chart.
OFFLINE = KubeCommands.for_repo(kubeconfig=None)
HELM = OFFLINE.binary("helm")

Manifest = dict[str, Any]


class Rendered(list[Manifest]):
    """The objects of one render, with lookups by kind, name and namespace."""

    def all(self, kind: str) -> list[Manifest]:
        return [m for m in self if m["kind"] == kind]

    def one(self, kind: str, name: str | None = None, namespace: str | None = None) -> Manifest:
        found = [m for m in self.all(kind) if (name is None or m["metadata"]["name"] == name)
                 and (namespace is None or m["metadata"].get("namespace") == namespace)]
        assert len(found) == 1, f"expected one {kind} {name or ''} in {namespace or 'any namespace'}, got {len(found)}"
        return found[0]

    @property
    def operator(self) -> Manifest:
        return self.one("StatefulSet")

    @property
    def container(self) -> Manifest:
        container: Manifest = self.operator["spec"]["template"]["spec"]["containers"][0]
        return container

    @property
    def args(self) -> list[str]:
        return list(self.container["args"])


def helm(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    if not HELM.exists():
        if os.environ.get("CI"):  # make test builds helm before these tests: missing is a fault
            pytest.fail(f"helm is not at {HELM}: make bins did not build it")
        pytest.skip("helm is not built yet: run make bins")
    # -f - reads the values from stdin; JSON is YAML.
    return OFFLINE.run("helm", *args, "-f", "-", stdin=json.dumps(values or {}), timeout=60)


def render(values: dict[str, Any] | None = None, *, namespace: str = "pp-system",
           release: str = "persistent-pipelines") -> Rendered:
    """The chart rendered with these values merged over values.yaml (as `helm install -f`)."""
    result = helm("template", release, str(CHART), "--namespace", namespace, values=values)
    assert result.returncode == 0, result.stderr
    return Rendered(m for m in yaml.safe_load_all(result.stdout) if m)


def render_error(values: dict[str, Any]) -> str:
    """The error of a render that must fail (what `helm install` would print)."""
    result = helm("template", "persistent-pipelines", str(CHART), values=values)
    assert result.returncode != 0, f"rendered although it should not have: {values}"
    return result.stderr
