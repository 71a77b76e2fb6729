"""The chart installed for an end-to-end test module (see conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from demo.story import Namespace
from demo.targets import Target

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "persistent-pipelines"
KUBECTL_PATH_MANIFEST = ROOT / "deploy" / "persistent-pipelines.yaml"


@dataclass
class Release:
    """The chart installed for one test module: the operator in `system`, serving `jobs`."""

    target: Target
    name: str
    system: str
    jobs: Namespace
    installs: int = 0

    @property
    def operator_account(self) -> str:
        return f"system:serviceaccount:{self.system}:{self.name}-operator"

    @property
    def driver_account(self) -> str:
        return f"system:serviceaccount:{self.jobs.name}:spark-app-driver"

    def install(self, *values: str, kubernetes_executors: bool = False) -> None:
        """helm upgrade --install with the target's values, serving only the jobs namespace;
        ``kubernetes_executors`` lets its drivers run executor pods there."""
        self.target.helm("upgrade", "--install", self.name, str(CHART), "--namespace", self.system,
                         *self.target.helm_values(),
                         "--set", f"operator.watchNamespaces={{{self.jobs.name}}}",
                         "--set", f"driver.jobNamespaces[0].name={self.jobs.name}",
                         "--set", f"driver.jobNamespaces[0].kubernetesExecutors={str(kubernetes_executors).lower()}",
                         *values, "--wait", "--timeout", "5m")
        self.installs += 1

    def uninstall(self) -> None:
        self.target.helm("uninstall", self.name, "--namespace", self.system, "--wait", "--timeout", "3m")

    def installed(self) -> bool:
        return bool(self.target.helm("list", "-n", self.system, "-q", "--filter", f"^{self.name}$").strip())
