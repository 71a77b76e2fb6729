"""The end-to-end tests' cluster and release.

The target cluster comes from the environment (demo.targets.from_environment): the
repository's local control plane by default (started here if it is not running, and then
stopped at the end), or with E2E_TARGET=kind the kind cluster of E2E_KUBECONFIG that
`make e2e-kind` created and loaded the images into. Either way the chart is installed with
helm, and the operator runs as a pod with the chart's RBAC alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from e2e_release import CHART, KUBECTL_PATH_MANIFEST, Release

from demo.story import Namespace
from demo.targets import LocalTarget, Target, from_environment


@pytest.fixture(scope="session")
def target() -> Iterator[Target]:
    chosen = from_environment()
    if isinstance(chosen, LocalTarget):
        chosen.start()
    try:
        remove_leftovers(chosen)
        yield chosen
    finally:
        if isinstance(chosen, LocalTarget) and chosen.started_here:
            chosen.stop()


@pytest.fixture(scope="module")
def release(target: Target) -> Iterator[Release]:
    """Two fresh namespaces that enforce Pod Security "restricted" (the operator's and the
    pipelines'), and the chart's CRDs; the release itself is installed by the tests."""
    suffix = uuid.uuid4().hex[:5]
    release = Release(target, "persistent-pipelines", f"pp-e2e-system-{suffix}",
                      Namespace(target, f"pp-e2e-{suffix}"))
    for namespace in (release.system, release.jobs.name):  # both enforce Pod Security "restricted"
        target.create_namespace(namespace)
    # Helm creates the CRDs only where they are absent and never upgrades them; the cluster
    # may hold an older copy from an earlier install.
    target.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    yield release
    cleanup(release)


def cleanup(release: Release) -> None:
    target, jobs = release.target, release.jobs.name
    names = target.kubectl("get", "ppl", "-n", jobs, "-o", "name", check=False).split()
    if names and release.installed():
        target.kubectl("delete", "-n", jobs, *names, "--timeout=120s", check=False, timeout=180)
    for name in target.kubectl("get", "ppl", "-n", jobs, "-o", "name", check=False).split():
        target.kubectl("patch", "-n", jobs, name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                       check=False)
    if release.installed():
        release.uninstall()
    target.kubectl("delete", "namespace", jobs, release.system, "--ignore-not-found", "--timeout=180s", check=False,
                   timeout=240)
    target.forget_claims(jobs)


def remove_leftovers(target: Target) -> None:
    """Removes what an interrupted earlier run left on a cluster that keeps its state: its
    operator would still hold the host ports (on the local cluster) and serve its namespaces.
    No graceful stops here: the operator goes first, then the pipelines' finalizers."""
    namespaces = target.kubectl("get", "namespaces", "-o", "name", check=False).split()
    for system in (name.removeprefix("namespace/") for name in namespaces):
        if not system.startswith("pp-e2e-system-"):
            continue
        leftover = Release(target, "persistent-pipelines", system,
                           Namespace(target, "pp-e2e-" + system.removeprefix("pp-e2e-system-")))
        print(f"removing the leftovers of an interrupted e2e run ({leftover.system}, {leftover.jobs.name})")
        if leftover.installed():
            leftover.uninstall()
        cleanup(leftover)
    target.kubectl("delete", "-f", str(KUBECTL_PATH_MANIFEST), "--ignore-not-found", "--wait=true",
                   "--timeout=120s", check=False, timeout=180)
