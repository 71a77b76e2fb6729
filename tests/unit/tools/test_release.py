"""The release path: the workflows parse and say what the README promises (both Dockerfile
targets built multi-arch and pushed where the chart and the CRD look for them, the chart
pushed as an OCI artifact after them, lint and unit tests on pull requests, everything on
main), every action is pinned by commit, and a tag's version is checked against the files."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tools.release.check_version import CHART, chart_field, release_version, stated_versions

ROOT = Path(__file__).resolve().parents[3]
WORKFLOWS = ROOT / ".github" / "workflows"
RELEASE = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
CI = yaml.safe_load((WORKFLOWS / "ci.yml").read_text())
CHART_YAML = yaml.safe_load((ROOT / CHART).read_text())


def triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    # YAML 1.1 reads the key `on` as True.
    found: dict[str, Any] = workflow[True]
    return found


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job["steps"])


def step_using(job: dict[str, Any], action: str) -> dict[str, Any]:
    found = [s for s in steps(job) if s.get("uses", "").startswith(f"{action}@")]
    assert len(found) == 1, f"expected one {action} step, got {len(found)}"
    return found[0]


def scripts(job: dict[str, Any]) -> str:
    return "\n".join(s["run"] for s in steps(job) if "run" in s)


def dockerfile_stages() -> set[str]:
    return set(re.findall(r"^FROM \S+ AS (\S+)$", (ROOT / "Dockerfile").read_text(), re.M))


@pytest.mark.parametrize("path", sorted(WORKFLOWS.glob("*.yml")), ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_commit_and_names_its_release(path: Path) -> None:
    uses = re.findall(r"^\s*(?:- )?uses: (\S+)(.*)$", path.read_text(), re.M)
    assert uses
    for action, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", action), f"{action} is not pinned to a commit"
        assert re.fullmatch(r" # v\d+\.\d+\.\d+", comment), f"{action}: the comment should name its release"


def test_a_version_tag_builds_both_dockerfile_targets_for_two_architectures_and_pushes_them() -> None:
    assert triggers(RELEASE) == {"push": {"tags": ["v*.*.*"]}}
    images = RELEASE["jobs"]["images"]
    targets = images["strategy"]["matrix"]["target"]
    assert set(targets) == {"spark-app", "operator"} and set(targets) <= dockerfile_stages()
    build = step_using(images, "docker/build-push-action")["with"]
    assert build["file"] == "Dockerfile" and build["target"] == "${{ matrix.target }}" and build["push"] is True
    assert set(build["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert step_using(images, "docker/setup-qemu-action")["with"]["platforms"] == "arm64"
    step_using(images, "docker/setup-buildx-action")
    assert step_using(images, "docker/login-action")["with"]["registry"] == "ghcr.io"
    assert build["tags"] == "${{ env.IMAGE_NAMESPACE }}/${{ matrix.target }}:${{ needs.version.outputs.version }}"
    assert images["needs"] == "version" and images["permissions"]["packages"] == "write"


def test_the_images_are_pushed_where_the_chart_and_the_crd_look_for_them() -> None:
    namespace = RELEASE["env"]["IMAGE_NAMESPACE"]
    values = yaml.safe_load((ROOT / "charts" / "persistent-pipelines" / "values.yaml").read_text())
    image = values["operator"]["image"]
    assert f"{image['registry']}/{image['repository']}" == f"{namespace}/operator"
    crd = yaml.safe_load((ROOT / "crds" / "persistentpipelines.sparkapp.dev.yaml").read_text())
    default = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["image"]
    assert default["default"] == f"{namespace}/spark-app:{CHART_YAML['appVersion']}"


def test_the_chart_is_pushed_as_an_oci_artifact_after_the_images() -> None:
    chart = RELEASE["jobs"]["chart"]
    assert set(chart["needs"]) == {"version", "images"}
    assert RELEASE["env"]["CHART_REPOSITORY"].startswith("oci://ghcr.io/")
    run = scripts(chart)
    assert "helm package charts/persistent-pipelines" in run
    assert 'helm push "dist/persistent-pipelines-$VERSION.tgz" "$CHART_REPOSITORY"' in run
    assert CHART_YAML["name"] == "persistent-pipelines"


def test_the_tag_is_checked_against_the_files_before_anything_is_built() -> None:
    version = RELEASE["jobs"]["version"]
    assert 'python3 tools/release/check_version.py "$GITHUB_REF_NAME"' in scripts(version)
    assert version["outputs"]["version"] == "${{ steps.version.outputs.version }}"


def test_pull_requests_run_lint_and_unit_tests_and_main_runs_everything_as_root() -> None:
    assert set(triggers(CI)) == {"pull_request", "push"} and triggers(CI)["push"] == {"branches": ["main"]}
    quick = scripts(CI["jobs"]["lint-and-unit"]).splitlines()
    assert "make lint" in quick and "make test-unit" in quick
    everything = CI["jobs"]["everything"]
    assert everything["if"] == "github.event_name == 'push'" and everything["timeout-minutes"] <= 360
    assert re.search(r"^sudo .*\.ci/run$", scripts(everything), re.M)
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("exec make test")


def test_the_version_of_a_tag_is_the_one_the_files_state() -> None:
    assert chart_field((ROOT / CHART).read_text(), "version") == CHART_YAML["version"]
    assert chart_field((ROOT / CHART).read_text(), "appVersion") == CHART_YAML["appVersion"]
    assert release_version(f"v{CHART_YAML['version']}") == CHART_YAML["version"]
    with pytest.raises(ValueError, match="not a release tag"):
        release_version(CHART_YAML["version"])


def test_a_tag_that_disagrees_with_a_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    for name in (CHART, "pyproject.toml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    chart = tmp_path / CHART
    chart.write_text(re.sub(r'^appVersion: .*$', 'appVersion: "9.9.9"', chart.read_text(), flags=re.M))
    assert stated_versions(tmp_path)[f"{CHART} appVersion"] == "9.9.9"
    with pytest.raises(ValueError) as refused:
        release_version(f"v{CHART_YAML['version']}", tmp_path)
    assert str(refused.value).count("Chart.yaml") == 1 and "appVersion is '9.9.9'" in str(refused.value)
