"""The layering of localcluster, checked: pure builders import no process, thread or API code,
and container_init stays standard-library only (it runs with `python -S`)."""

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "localcluster"
PURE = [
    "layout.py",
    "controlplane.py",
    "kubelet/images.py",
    "kubelet/envvars.py",
    "kubelet/volumes.py",
    "kubelet/launch.py",
    "kubelet/status.py",
    "kubelet/node.py",
    "kubelet/storage.py",
    "kubelet/hosts.py",
]
IMPURE = {
    "subprocess",
    "threading",
    "urllib3",
    "localcluster.kubeapi",
    "localcluster.cluster",
    "localcluster.procs",
    "localcluster.node_agent",
    "localcluster.kubelet.runtime",
    "localcluster.kubelet.probes",
    "localcluster.kubelet.logs",
    "localcluster.kubelet.events",
    "localcluster.kubelet.pods",
}


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_nothing_impure(module: str) -> None:
    assert imports(PACKAGE / module) & IMPURE == set()


def test_container_init_uses_the_standard_library_only() -> None:
    third_party = {
        name
        for name in imports(PACKAGE / "container_init.py")
        if name.split(".")[0] not in sys.stdlib_module_names
    }
    assert third_party == set()
