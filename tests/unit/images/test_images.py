"""The images (Dockerfile) run what the local node agent maps their names to
(localcluster/images.yaml), so the demo and the e2e tests exercise the real entrypoints;
and the names agree with the chart and the CRD's default."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
IMAGE_MAP = yaml.safe_load((ROOT / "localcluster" / "images.yaml").read_text())["images"]
SPARK_APP, OPERATOR = "ghcr.io/persistent-pipelines/spark-app", "ghcr.io/persistent-pipelines/operator"


def stage(name: str) -> str:
    """The instructions of one build stage."""
    match = re.search(rf"^FROM \S+ AS {re.escape(name)}\n(.*?)(?=^FROM |\Z)", DOCKERFILE, re.M | re.S)
    assert match, f"no stage {name} in the Dockerfile"
    return match.group(1)


def instruction(stage_text: str, keyword: str) -> str:
    found = re.findall(rf"^{keyword} (.+)$", stage_text, re.M)
    assert found, f"no {keyword}"
    return str(found[-1])


def python_argv(entrypoint: list[str]) -> list[str]:
    """The local map runs {python} (the venv's); the image runs python from its venv."""
    return ["python" if part in ("{python}", "python") else part for part in entrypoint]


def test_the_spark_app_image_runs_the_mapped_entrypoint_in_the_mapped_folder() -> None:
    text = stage("spark-app")
    mapped = IMAGE_MAP[SPARK_APP]
    assert json.loads(instruction(text, "ENTRYPOINT")) == python_argv(mapped["entrypoint"])
    assert instruction(text, "WORKDIR") == "/opt/spark-app"
    assert "COPY examples/ /opt/spark-app/examples/" in text, "pipeline files are relative to the workdir"
    assert "SPARK_APP_JARS_DIR=/opt/spark-app/jars" in text and "SPARK_APP_JARS_DIR" in mapped["env"]


def test_the_operator_image_runs_the_mapped_entrypoint() -> None:
    assert json.loads(instruction(stage("operator"), "ENTRYPOINT")) == python_argv(IMAGE_MAP[OPERATOR]["entrypoint"])


def test_both_images_run_as_a_numeric_non_root_user() -> None:
    for name in ("spark-app", "operator"):
        user = instruction(stage(name), "USER")
        uid, _, gid = user.partition(":")
        assert uid.isdigit() and int(uid) != 0 and gid.isdigit(), f"{name}: USER {user}"


def test_base_images_are_pinned_to_exact_versions() -> None:
    for image in re.findall(r"^ARG \w+_IMAGE=(\S+)$", DOCKERFILE, re.M):
        tag = image.rsplit(":", 1)[1]
        assert re.match(r"^\d+\.\d+\.\d+", tag), f"{image} is not pinned to an exact version"


def test_the_spark_app_image_carries_the_pinned_jars_and_the_locked_packages() -> None:
    assert "tools/jars/install.sh" in stage("jars"), "the same script (and pom.xml) as make jars"
    assert "uv sync --no-dev --no-editable" in stage("spark-app-venv") and "UV_FROZEN=1" in DOCKERFILE


def test_the_chart_and_the_crd_name_the_same_images_and_version() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "persistent-pipelines" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts" / "persistent-pipelines" / "values.yaml").read_text())
    image = values["operator"]["image"]
    assert f"{image['registry']}/{image['repository']}" == OPERATOR
    crd = yaml.safe_load((ROOT / "crds" / "persistentpipelines.sparkapp.dev.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["image"]["default"] == f"{SPARK_APP}:{chart['appVersion']}"
    project = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{chart["appVersion"]}"' in project


def test_the_images_carry_neither_localcluster_nor_the_dev_group() -> None:
    """localcluster is a development tool (its own workspace member, in the dev group only):
    the build context keeps it out, and the product's wheel does not package it."""
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    let_in = [line.removeprefix("!").strip("/") for line in ignore if line.startswith("!")]
    assert not [path for path in let_in if path.split("/")[0] in ("localcluster", "demo", "tests")], let_in
    assert "COPY localcluster" not in DOCKERFILE
    assert "uv sync --no-dev" in stage("spark-app-venv") and "uv export --no-dev" in stage("operator-venv")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "localcluster" not in project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert "localcluster" not in project["project"]["scripts"]
    assert "localcluster" in project["dependency-groups"]["dev"]
    assert "localcluster" not in " ".join(project["project"]["dependencies"])


# ---- the Kafka broker: one version, and one manifest for kind and the local cluster --------

KAFKA_MANIFEST = list(yaml.safe_load_all((ROOT / "demo" / "kafka.yaml").read_text()))
KAFKA_SET = next(doc for doc in KAFKA_MANIFEST if doc["kind"] == "StatefulSet")
KAFKA_POD = KAFKA_SET["spec"]["template"]


def test_the_kafka_image_the_jars_and_the_kind_load_are_one_version() -> None:
    pom = (ROOT / "tools" / "kafka" / "pom.xml").read_text()
    version = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert version
    image = KAFKA_POD["spec"]["containers"][0]["image"]
    assert image == f"apache/kafka:{version.group(1)}"
    assert f"KAFKA_IMAGE := {image}" in (ROOT / "Makefile").read_text()
    assert "apache/kafka" in IMAGE_MAP


def test_the_kafka_manifest_gives_the_local_runner_a_broker_clients_reach_by_the_service_name() -> None:
    from localcluster.kafka import config_from_env
    from localcluster.kubelet.envvars import resolve_env

    pod = {"metadata": {"name": "kafka-0", "namespace": "pp-demo"}, "spec": KAFKA_POD["spec"]}
    container = KAFKA_POD["spec"]["containers"][0]
    config = config_from_env(resolve_env(container, pod, {}), bind_host="127.0.0.1")
    service = next(doc for doc in KAFKA_MANIFEST if doc["kind"] == "Service")
    assert service["metadata"]["name"] == "kafka" and service["spec"]["ports"][0]["port"] == 9092
    assert (config.property("advertised.listeners") or "").startswith("PLAINTEXT://kafka.pp-demo.svc:9092,")
    assert (config.property("listeners") or "").startswith("PLAINTEXT://127.0.0.1:9092,")
    assert config.property("transaction.state.log.replication.factor") == "1"
    assert config.property("transaction.state.log.min.isr") == "1"
    # Kubelet's service links (KAFKA_PORT=tcp://...) would otherwise become broker properties.
    assert KAFKA_POD["spec"]["enableServiceLinks"] is False
