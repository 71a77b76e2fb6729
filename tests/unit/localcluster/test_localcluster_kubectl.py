"""The kubectl and helm wrapper, against stand-in binaries that print their arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster.kubectl import CommandFailed, KubeCommands

# Prints its arguments and stdin; exits with the code in the file exit-code beside it (0 if none),
# complaining on stderr when that is not 0.
FAKE = """#!/bin/sh
echo "$0 $*"
cat
code=$(cat "$(dirname "$0")/exit-code" 2>/dev/null || echo 0)
[ "$code" = 0 ] || echo "it went wrong" >&2
exit "$code"
"""


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    for tool in ("kubectl", "helm"):
        (tmp_path / tool).write_text(FAKE)
        (tmp_path / tool).chmod(0o755)
    return tmp_path


def test_both_tools_run_against_the_kubeconfig_with_stdin(bin_dir: Path) -> None:
    commands = KubeCommands(Path("/clusters/one.yaml"), bin_dir)
    assert commands.kubectl("get", "pods", stdin="piped") == f"{bin_dir}/kubectl --kubeconfig=/clusters/one.yaml get pods\npiped"
    assert commands.helm("list").startswith(f"{bin_dir}/helm --kubeconfig=/clusters/one.yaml list\n")


def test_without_a_kubeconfig_no_cluster_is_named(bin_dir: Path) -> None:
    assert KubeCommands(None, bin_dir).helm("template", "chart") == f"{bin_dir}/helm template chart\n"


def test_a_failure_raises_with_the_command_and_its_output_unless_unchecked(bin_dir: Path) -> None:
    (bin_dir / "exit-code").write_text("3")
    commands = KubeCommands(Path("k"), bin_dir)
    with pytest.raises(CommandFailed, match=r"^kubectl delete 'pod x' failed \(exit 3\): it went wrong$") as failed:
        commands.kubectl("delete", "pod x")
    assert failed.value.returncode == 3 and isinstance(failed.value, RuntimeError)
    assert commands.kubectl("auth", "can-i", "get", "pods", check=False).startswith(f"{bin_dir}/kubectl")
    assert commands.run("helm", "lint").returncode == 3
