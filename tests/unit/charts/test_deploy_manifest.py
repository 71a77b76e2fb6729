"""The kubectl path (deploy/) installs what the chart installs."""

from __future__ import annotations

import subprocess

import yaml
from chart_render import HELM, ROOT, helm, render

MANIFEST = ROOT / "deploy" / "persistent-pipelines.yaml"


def test_the_deploy_manifest_is_the_chart_rendered_now() -> None:
    helm("version")  # skips when helm is not built
    rendered = subprocess.run([str(ROOT / "deploy" / "render.sh"), str(HELM)], capture_output=True, text=True,
                              check=True, timeout=60).stdout
    assert MANIFEST.read_text() == rendered, "deploy/ drifted from the chart: run make deploy-manifest"


def test_the_deploy_manifest_holds_the_namespace_and_the_charts_default_objects() -> None:
    objects = [o for o in yaml.safe_load_all(MANIFEST.read_text()) if o]
    assert objects[0] == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "persistent-pipelines"}}
    chart = render(namespace="persistent-pipelines")
    assert objects[1:] == list(chart)
    assert not [o for o in objects if o["kind"] == "CustomResourceDefinition"], "CRDs come from crds/"
