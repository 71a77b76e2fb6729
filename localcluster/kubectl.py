"""kubectl and helm, the checkout's own (`.cache/bin`, built by make bins), against one
kubeconfig: the one way the demo, the end-to-end, operator and cluster tests and
`python -m localcluster kill` run them, on the local cluster or on any other (kind).

    commands = KubeCommands.for_repo(info.kubeconfig)
    commands.kubectl("get", "pods", "-n", "demo")          # stdout; CommandFailed on an error
    commands.helm("upgrade", "--install", "pp", "charts/persistent-pipelines")
    commands.run("helm", "template", ...)                  # the CompletedProcess, whatever the exit
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from localcluster.layout import Layout

KUBECTL_TIMEOUT = 120.0
# An install with --wait waits for the operator's pod, a few minutes on a busy machine.
HELM_TIMEOUT = 300.0


class CommandFailed(RuntimeError):
    """kubectl or helm exited with an error; the message has the command and what it printed."""

    def __init__(self, command: list[str], returncode: int, output: str) -> None:
        self.returncode = returncode
        self.output = output
        super().__init__(f"{shlex.join(command)} failed (exit {returncode}): {output}")


@dataclass(frozen=True)
class KubeCommands:
    """The command-line clients of one cluster."""

    kubeconfig: Path | None
    """The cluster's kubeconfig; None for commands that need no cluster (helm template, lint)."""
    bin_dir: Path
    """Where kubectl and helm are."""

    @classmethod
    def for_repo(cls, kubeconfig: Path | None, layout: Layout | None = None) -> KubeCommands:
        return cls(kubeconfig, (layout or Layout.for_repo()).bin_dir)

    def binary(self, tool: str) -> Path:
        return self.bin_dir / tool

    def run(self, tool: str, *args: str, stdin: str | None = None,
            timeout: float = KUBECTL_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """Runs `tool` (kubectl or helm) with `args`, whatever its exit code."""
        cluster = [f"--kubeconfig={self.kubeconfig}"] if self.kubeconfig is not None else []
        return subprocess.run([str(self.binary(tool)), *cluster, *args], input=stdin, capture_output=True,
                              text=True, timeout=timeout)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = KUBECTL_TIMEOUT) -> str:
        """kubectl's stdout; with `check`, CommandFailed when it exits with an error."""
        return self._stdout("kubectl", args, stdin, check, timeout)

    def helm(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = HELM_TIMEOUT) -> str:
        """helm's stdout; with `check`, CommandFailed when it exits with an error."""
        return self._stdout("helm", args, stdin, check, timeout)

    def _stdout(self, tool: str, args: tuple[str, ...], stdin: str | None, check: bool, timeout: float) -> str:
        result = self.run(tool, *args, stdin=stdin, timeout=timeout)
        if check and result.returncode != 0:
            raise CommandFailed([tool, *args], result.returncode, (result.stderr or result.stdout).strip())
        return result.stdout
