"""The image map (localcluster/images.yaml): image references to local commands. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

DOCKER_HUB = "docker.io"


@dataclass(frozen=True)
class ImageConfig:
    """What an image's config would say: ENTRYPOINT, CMD, WORKDIR and ENV."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    working_dir: str | None = None
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ImageMap:
    images: Mapping[str, ImageConfig] = field(default_factory=dict)
    """Normalised repository -> config."""

    def resolve(self, image: str) -> ImageConfig | None:
        return self.images.get(normalize_repository(image))


def normalize_repository(image: str) -> str:
    """`busybox:1.36` -> `docker.io/library/busybox`; tags and digests are dropped."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    last = last.split(":", 1)[0]
    name = f"{head}/{last}" if head else last
    parts = name.split("/")
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost"):
        domain, path = first, parts[1:]
    else:
        domain, path = DOCKER_HUB, parts
    if domain == "index.docker.io":
        domain = DOCKER_HUB
    if domain == DOCKER_HUB and len(path) == 1:
        path = ["library", *path]
    return "/".join([domain, *path])


def load_image_map(text: str, placeholders: Mapping[str, str]) -> ImageMap:
    """Parses images.yaml, substituting {repo}, {venv}, {python}."""
    document: dict[str, Any] = yaml.safe_load(text) or {}
    images: dict[str, ImageConfig] = {}
    for repository, raw in (document.get("images") or {}).items():
        images[normalize_repository(repository)] = _image_config(raw or {}, placeholders)
    return ImageMap(images)


def _image_config(raw: Mapping[str, Any], placeholders: Mapping[str, str]) -> ImageConfig:
    def sub(value: object) -> str:
        return _substitute(str(value), placeholders)

    return ImageConfig(
        entrypoint=tuple(sub(a) for a in raw.get("entrypoint") or ()),
        cmd=tuple(sub(a) for a in raw.get("cmd") or ()),
        working_dir=sub(raw["workingDir"]) if raw.get("workingDir") else None,
        env=tuple((str(k), sub(v)) for k, v in (raw.get("env") or {}).items()),
    )


def _substitute(value: str, placeholders: Mapping[str, str]) -> str:
    # Plain replacement, not str.format: commands may hold braces of their own (${VAR}).
    for key, replacement in placeholders.items():
        value = value.replace("{" + key + "}", replacement)
    return value


def compose_argv(image: ImageConfig, command: Sequence[str] | None, args: Sequence[str] | None) -> list[str]:
    """Docker's rules: `command` replaces ENTRYPOINT (and drops CMD), `args` replace CMD."""
    if command:
        return [*command, *(args or ())]
    return [*image.entrypoint, *(args if args else image.cmd)]
