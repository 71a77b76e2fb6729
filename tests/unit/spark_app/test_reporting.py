"""The driver's reports to its pod: off the commit path, newest first, never in a loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from spark_app import contract
from spark_app.runtime.reporting import PodReporter


def report(batch: int) -> contract.DriverReport:
    return contract.DriverReport(epoch=1, stored_epoch=0, state="running",
                                 queries={"out": contract.QueryReport(batch=batch)})


class HangingApi:
    """An API server that accepts the connection but does not answer until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.seen: list[dict[str, Any]] = []

    def patch(self, annotations: dict[str, Any]) -> None:
        self.release.wait(30)
        self.seen.append(json.loads(annotations[contract.STATUS_ANNOTATION]))


def test_a_hung_api_server_does_not_hold_up_the_caller_and_the_newest_status_wins() -> None:
    api = HangingApi()
    reporter = PodReporter(api.patch, "pod ns/p")
    began = time.monotonic()
    for batch in range(50):
        reporter.report(report(batch))
    assert time.monotonic() - began < 1.0  # a commit reports and goes on
    api.release.set()
    reporter.close()
    assert api.seen[-1]["queries"]["out"]["batch"] == 49 and api.seen[-1]["reported_ms"] > 0
    assert len(api.seen) <= 2  # the first, then the newest: not all 50


def test_a_failing_api_server_is_warned_about_once_and_retried_at_the_next_change() -> None:
    calls: list[int] = []

    def refuse(annotations: dict[str, Any]) -> None:
        calls.append(1)
        raise ConnectionError("refused")

    reporter = PodReporter(refuse, "pod ns/p")
    reporter.report(report(1))
    time.sleep(0.3)
    reporter.report(report(2))
    reporter.close()
    assert 2 <= len(calls) <= 3


def _modules_after_early_import(env: dict[str, str]) -> dict[str, bool]:
    """In a new interpreter: whether the early import ran in a thread, and what it imported."""
    probe = (
        "import json, sys\n"
        "from spark_app.runtime import reporting\n"
        "before = 'kubernetes.client' in sys.modules\n"
        "thread = reporting.import_client_early()\n"
        "thread is not None and thread.join(60)\n"
        "print(json.dumps({'before': before, 'thread': thread is not None,\n"
        "                  'after': 'kubernetes.client' in sys.modules}))\n"
    )
    environ = {k: v for k, v in os.environ.items() if k not in (contract.POD_NAME, contract.POD_NAMESPACE)}
    result = subprocess.run([sys.executable, "-c", probe], env={**environ, **env}, capture_output=True,
                            text=True, check=True)
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_a_driver_in_a_pod_imports_the_kubernetes_client_while_its_jvm_starts() -> None:
    in_pod = _modules_after_early_import({contract.POD_NAME: "words-driver-1", contract.POD_NAMESPACE: "data"})
    assert in_pod == {"before": False, "thread": True, "after": True}
    # Outside Kubernetes there is nothing to report to: nothing is imported.
    assert _modules_after_early_import({}) == {"before": False, "thread": False, "after": False}
