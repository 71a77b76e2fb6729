"""The CRD (crds/persistentpipelines.sparkapp.dev.yaml) and the operator agree: names,
defaults, every field the examples use, the cross-field rules, and what status holds."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pipeline_operator import names
from pipeline_operator.lifecycle import next_action
from pipeline_operator.memory import MAX_MESSAGE_CHARS
from pipeline_operator.spec import parse_spec
from pipeline_operator.status import render
from ppl_factories import NAME, NAMESPACE, RICH_MEMORY, TUNABLES, observed, raw, spec

ROOT = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((ROOT / "crds" / "persistentpipelines.sparkapp.dev.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
EXAMPLES = sorted((ROOT / "operator" / "examples").glob("*.yaml"))


def with_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: a missing field with a default gets
    it, then defaults apply inside (including inside the defaults themselves)."""
    if isinstance(value, dict) and "properties" in schema:
        value = dict(value)
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = with_defaults(sub, value[key])
    return value


def unknown_fields(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(value, dict):
        properties, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, sub in value.items():
            child = (properties or {}).get(key) or (extra if isinstance(extra, dict) else None)
            if child is None:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(child, sub, f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += unknown_fields(schema["items"], item, f"{path}[{i}]")
    return found


def test_names_match_the_operator() -> None:
    spec = CRD["spec"]
    assert (spec["group"], VERSION["name"], spec["names"]["kind"], spec["names"]["plural"]) == (
        names.GROUP, names.VERSION, names.KIND, names.PLURAL)
    assert spec["names"]["shortNames"] == ["ppl"] and CRD["metadata"]["name"] == f"{names.PLURAL}.{names.GROUP}"
    assert VERSION["subresources"] == {"status": {}}


def test_printer_columns_show_phase_restarts_checkpoint_age_and_age() -> None:
    columns = {c["name"]: (c["type"], c["jsonPath"]) for c in VERSION["additionalPrinterColumns"]}
    assert columns["Phase"] == ("string", ".status.phase")
    assert columns["Restarts"] == ("integer", ".status.restarts.total")
    assert columns["Last Checkpoint"] == ("date", ".status.checkpoint.time")
    assert columns["Age"] == ("date", ".metadata.creationTimestamp")


@pytest.mark.parametrize("base", ["filesystem", "s3"])
def test_the_schema_defaults_are_the_parsers_defaults(base: str) -> None:
    minimal = raw() if base == "filesystem" else {
        "application": {"module": "m"}, "persistence": {"s3": {"bucket": "bkt", "credentialsSecret": {"name": "c"}}}}
    defaulted = with_defaults(SCHEMA["properties"]["spec"], minimal)
    assert defaulted != minimal
    assert parse_spec(defaulted, namespace=NAMESPACE, name=NAME) == parse_spec(minimal, namespace=NAMESPACE, name=NAME)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_examples_use_only_schema_fields_and_parse(example: Path) -> None:
    manifest = yaml.safe_load(example.read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == (names.API_VERSION, names.KIND)
    assert unknown_fields(SCHEMA["properties"]["spec"], manifest["spec"]) == []
    assert parse_spec(manifest["spec"], namespace=NAMESPACE, name=manifest["metadata"]["name"])


def test_the_cross_field_rules_are_in_the_schema() -> None:
    spec = SCHEMA["properties"]["spec"]
    rules = [r["rule"] for node in (SCHEMA, spec, spec["properties"]["application"], spec["properties"]["persistence"])
             for r in node.get("x-kubernetes-validations", [])]
    assert "size(self.metadata.name) <= 56" in rules
    assert "has(self.file) != has(self.module)" in rules
    assert "has(self.filesystem) != has(self.s3)" in rules
    assert any("degradedAfterSeconds >= 2 * self.snapshotIntervalSeconds" in r for r in rules)
    assert any("oldSelf.persistence" in r for r in rules), "a state root change needs a resetNonce"
    assert spec["properties"]["persistence"]["properties"]["s3"]["required"] == ["bucket"]
    assert spec["properties"]["persistence"]["properties"]["snapshotIntervalSeconds"]["minimum"] == 1


def test_what_the_operator_writes_in_status_fits_the_status_schema() -> None:
    status = render(RICH_MEMORY, name=NAME, generation=3, previous={}, now=1_800_000_000.0)
    assert unknown_fields(SCHEMA["properties"]["status"], status) == []
    first = next_action(observed(spec()), TUNABLES).memory
    assert unknown_fields(SCHEMA["properties"]["status"], render(first, name=NAME, generation=1, previous={},
                                                                 now=0.0)) == []


def test_the_status_schema_bounds_the_free_text_fields_at_what_the_operator_writes() -> None:
    """The API server refuses longer strings, from any writer; the operator's own status
    cuts every string to MAX_MESSAGE_CHARS (test_operator_status), so it always fits."""
    status = SCHEMA["properties"]["status"]["properties"]
    bounded = {
        "message": status["message"], "conditions.message": status["conditions"]["items"]["properties"]["message"],
        "conditions.reason": status["conditions"]["items"]["properties"]["reason"],
        "lastFailure.message": status["lastFailure"]["properties"]["message"],
        "lastFailure.reason": status["lastFailure"]["properties"]["reason"],
        "restarts.recent.reason": status["restarts"]["properties"]["recent"]["items"]["properties"]["reason"],
        "nextLaunch.reason": status["nextLaunch"]["properties"]["reason"],
        "halt.reason": status["halt"]["properties"]["reason"],
        "bookkeeping.announcedProblem": status["bookkeeping"]["properties"]["announcedProblem"],
    }
    assert {field: schema.get("maxLength") for field, schema in bounded.items()} == dict.fromkeys(
        bounded, MAX_MESSAGE_CHARS)
