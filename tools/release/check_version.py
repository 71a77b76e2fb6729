"""The version a release tag publishes, checked against the files that state it.

    python3 tools/release/check_version.py v0.2.0     # prints 0.2.0, or fails saying what differs

The release workflow (.github/workflows/release.yml) runs it first: the images are tagged
with this version and the chart is pushed with it, so Chart.yaml's version and appVersion
(the images' default tag) and pyproject.toml's version (the package inside the images) must
all say the same as the tag. Standard library only: it runs before any set-up.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = "charts/persistent-pipelines/Chart.yaml"
PYPROJECT = "pyproject.toml"
TAG = re.compile(r"^v(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)$")


def chart_field(text: str, key: str) -> str | None:
    """A top-level scalar of Chart.yaml (quoted or not); None if absent."""
    match = re.search(rf"^{key}:\s*[\"']?([^\"'\s#]+)[\"']?\s*(?:#.*)?$", text, re.M)
    return match.group(1) if match else None


def stated_versions(root: Path = ROOT) -> dict[str, str | None]:
    """Where the version is written (file and field) -> what it says there."""
    chart = (root / CHART).read_text()
    project = tomllib.loads((root / PYPROJECT).read_text())
    return {
        f"{CHART} version": chart_field(chart, "version"),
        f"{CHART} appVersion": chart_field(chart, "appVersion"),
        f"{PYPROJECT} project.version": project["project"].get("version"),
    }


def release_version(tag: str, root: Path = ROOT) -> str:
    """The version of a tag vX.Y.Z; ValueError when the tag is malformed or a file disagrees."""
    match = TAG.match(tag)
    if not match:
        raise ValueError(f"tag {tag!r} is not a release tag: expected vMAJOR.MINOR.PATCH (e.g. v0.2.0)")
    version = match.group(1)
    wrong = [f"{where} is {stated!r}" for where, stated in stated_versions(root).items() if stated != version]
    if wrong:
        raise ValueError(f"tag {tag} releases {version}, but " + "; ".join(wrong) +
                         ": set them to the tag's version and tag again")
    return version


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_version.py TAG", file=sys.stderr)
        return 2
    try:
        print(release_version(argv[0]))
    except ValueError as error:
        print(f"release: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
