"""The image map: references, placeholders, Docker's command/args rules."""

from pathlib import Path

import pytest

from localcluster.kubelet.images import ImageConfig, compose_argv, load_image_map, normalize_repository

REPO_IMAGES = Path(__file__).resolve().parents[3] / "localcluster" / "images.yaml"
PLACEHOLDERS = {"repo": "/r", "venv": "/r/.venv", "python": "/r/.venv/bin/python"}


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("busybox", "docker.io/library/busybox"),
        ("busybox:1.36", "docker.io/library/busybox"),
        ("library/busybox:latest", "docker.io/library/busybox"),
        ("docker.io/busybox", "docker.io/library/busybox"),
        ("index.docker.io/library/busybox", "docker.io/library/busybox"),
        ("bitnami/kubectl:1.30", "docker.io/bitnami/kubectl"),
        ("ghcr.io/persistent-pipelines/spark-app:0.1.0", "ghcr.io/persistent-pipelines/spark-app"),
        ("ghcr.io/persistent-pipelines/spark-app@sha256:abcd", "ghcr.io/persistent-pipelines/spark-app"),
        ("localhost:5000/app:dev", "localhost:5000/app"),
        ("registry.local:5000/team/app", "registry.local:5000/team/app"),
    ],
)
def test_normalize_repository_drops_tags_and_expands_docker_hub_names(image: str, repository: str) -> None:
    assert normalize_repository(image) == repository


def test_placeholders_are_substituted_and_braces_of_commands_kept() -> None:
    text = """
images:
  tool:
    entrypoint: ["{python}", "-c", "print('${HOME}')"]
    workingDir: "{repo}/work"
    env: {JARS: "{repo}/.cache/jars"}
"""
    config = load_image_map(text, PLACEHOLDERS).resolve("tool:1")
    assert config == ImageConfig(
        entrypoint=("/r/.venv/bin/python", "-c", "print('${HOME}')"),
        working_dir="/r/work",
        env=(("JARS", "/r/.cache/jars"),),
    )


def test_an_unknown_image_resolves_to_none() -> None:
    assert load_image_map("images: {busybox: {}}", PLACEHOLDERS).resolve("nginx") is None


@pytest.mark.parametrize(
    ("command", "args", "argv"),
    [
        (None, None, ["entry", "--default"]),
        (["sh", "-c"], None, ["sh", "-c"]),
        (["sh", "-c"], ["echo hi"], ["sh", "-c", "echo hi"]),
        (None, ["--flag"], ["entry", "--flag"]),
        ([], [], ["entry", "--default"]),
    ],
)
def test_command_replaces_the_entrypoint_and_args_replace_the_cmd(
    command: list[str] | None, args: list[str] | None, argv: list[str]
) -> None:
    image = ImageConfig(entrypoint=("entry",), cmd=("--default",))
    assert compose_argv(image, command, args) == argv


def test_args_alone_run_as_the_command_of_an_image_without_entrypoint() -> None:
    assert compose_argv(ImageConfig(cmd=("sh",)), None, ["echo", "hi"]) == ["echo", "hi"]


def test_the_shipped_image_map_runs_the_project_images_from_the_venv() -> None:
    images = load_image_map(REPO_IMAGES.read_text(), PLACEHOLDERS)
    spark = images.resolve("ghcr.io/persistent-pipelines/spark-app:latest")
    operator = images.resolve("ghcr.io/persistent-pipelines/operator:0.1.0")
    assert spark is not None and operator is not None
    assert spark.entrypoint == ("/r/.venv/bin/python", "-m", "spark_app.entrypoint")
    assert ("SPARK_APP_JARS_DIR", "/r/.cache/jars") in spark.env
    assert ("PYTHONUNBUFFERED", "1") in spark.env
    assert operator.entrypoint == ("/r/.venv/bin/python", "-m", "pipeline_operator")
    for generic in ("busybox", "alpine:3.20", "debian:bookworm", "python:3.11-slim"):
        assert images.resolve(generic) is not None, generic
    python = images.resolve("python:3.11")
    assert python is not None and dict(python.env)["PATH"].startswith("/r/.venv/bin:")
