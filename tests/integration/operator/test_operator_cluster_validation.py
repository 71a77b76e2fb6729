"""Bad input on the local control plane: the schema rejects malformed specs with the field
and the reason; semantic errors set a condition and an Event and create no pod; a driver
that exits as misconfigured is not crash-looped."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes import client
from ppl_cluster import GROUP, PLURAL, VERSION, Namespace, Operator, claim, eventually, wordcount

pytestmark = [pytest.mark.cluster]


def rejection(ns: Namespace, manifest: dict[str, Any]) -> str:
    """What the API server answers to creating ``manifest`` (what kubectl apply prints)."""
    try:
        ns.custom.create_namespaced_custom_object(GROUP, VERSION, ns.name, PLURAL, manifest)
    except client.ApiException as error:
        assert error.status == 422, error.body
        return str(json.loads(error.body)["message"])
    raise AssertionError("the API server accepted it")


def with_spec(**changes: Any) -> dict[str, Any]:
    manifest = wordcount("bad")
    for path, value in changes.items():
        node = manifest
        *parents, leaf = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return manifest


@pytest.mark.parametrize(("changes", "field", "reason"), [
    ({"spec__persistence__s3": {"bucket": "b"}}, "spec.persistence", "set exactly one backend"),
    ({"spec__persistence": {"s3": {"region": "eu-west-1"}}}, "spec.persistence.s3.bucket", "Required value"),
    ({"spec__persistence__snapshotIntervalSeconds": 0}, "spec.persistence.snapshotIntervalSeconds",
     "should be greater than or equal to 1"),
    ({"spec__persistence__snapshotIntervalSeconds": 10, "spec__persistence__degradedAfterSeconds": 15},
     "spec.persistence.degradedAfterSeconds", "must be at least 2 x snapshotIntervalSeconds"),
    ({"spec__application": {"args": ["x"]}}, "spec.application", "set exactly one of application.file"),
    ({"spec__state": "paused"}, "spec.state", 'Unsupported value: "paused"'),
    ({"spec__restartPolicy": {"backoff": {"initialSeconds": 60, "maxSeconds": 30}}},
     "spec.restartPolicy.backoff", "maxSeconds must be at least backoff.initialSeconds"),
    ({"metadata__name": "x" * 57}, "metadata.name", "must be at most 56 characters"),
    ({"spec__kafka": {"bootstrapServers": "kafka"}}, "spec.kafka.bootstrapServers", "should match"),
    ({"spec__kafka": {"bootstrapServers": "kafka:9092", "securityProtocol": "SASL_SSL"}}, "spec.kafka.sasl",
     "kafka.sasl (mechanism and credentialsSecret) is needed with securityProtocol SASL_PLAINTEXT or SASL_SSL"),
    ({"spec__kafka": {"bootstrapServers": "kafka:9092", "sasl": {"credentialsSecret": {"name": "k"}}}},
     "spec.kafka.sasl", "is needed with securityProtocol SASL_PLAINTEXT or SASL_SSL, and only with them"),
    ({"spec__kafka": {"bootstrapServers": "kafka:9092", "tls": {"caSecret": {"name": "ca"}}}},
     "spec.kafka.tls", "kafka.tls needs securityProtocol SSL or SASL_SSL"),
    ({"spec__kafka": {"bootstrapServers": "kafka:9092", "securityProtocol": "SSL",
                      "tls": {"caSecret": {"name": "ca"}, "caConfigMap": {"name": "ca"}}}},
     "spec.kafka.tls", "set exactly one of kafka.tls.caSecret and kafka.tls.caConfigMap"),
    ({"spec__kafka": {"bootstrapServers": "kafka:9092", "securityProtocol": "SASL_PLAINTEXT",
                      "sasl": {"mechanism": "GSSAPI", "credentialsSecret": {"name": "k"}}}},
     "spec.kafka.sasl.mechanism", 'Unsupported value: "GSSAPI"'),
])
def test_the_schema_rejects_malformed_specs_with_field_and_reason(ns: Namespace, changes: dict[str, Any],
                                                                   field: str, reason: str) -> None:
    message = rejection(ns, with_spec(**changes))
    assert field in message and reason in message, message


def test_moving_the_state_under_last_state_needs_a_reset_nonce(ns: Namespace) -> None:
    ns.apply(wordcount(state="suspended"))
    moved = {"spec": {"persistence": {"filesystem": {"claimName": "elsewhere"}}}}
    with pytest.raises(client.ApiException) as refused:
        ns.custom.patch_namespaced_custom_object(GROUP, VERSION, ns.name, PLURAL, "wordcount", moved)
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert "spec.persistence: Forbidden" in message and "resetNonce" in message, message
    moved["spec"]["persistence"]["resetNonce"] = "fresh-start"  # type: ignore[index]
    ns.custom.patch_namespaced_custom_object(GROUP, VERSION, ns.name, PLURAL, "wordcount", moved)


def test_a_missing_claim_or_secret_sets_a_condition_and_an_event_and_creates_no_pod(
        ns: Namespace, operator: Operator) -> None:
    ns.apply(wordcount(persistence={"snapshotIntervalSeconds": 5, "filesystem": {"claimName": "not-yet"}}))
    invalid = eventually("the Invalid phase", lambda: ns.status("wordcount").get("phase") == "Invalid", timeout=30)
    assert invalid
    degraded = next(c for c in ns.status("wordcount")["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "PersistentVolumeClaim" in degraded["message"] and "not-yet" in degraded["message"]
    ns.announced("wordcount", "InvalidSpec")
    time.sleep(4)
    assert ns.pod("wordcount-driver") is None
    assert ns.event_reasons("wordcount").count("InvalidSpec") == 1, "announced once, not at every recheck"

    ns.apply(claim("not-yet"))
    eventually("a driver once the claim exists", lambda: ns.pod("wordcount-driver"), timeout=30)
    ns.patch("wordcount", {"state": "suspended"})

    s3 = wordcount("s3-pipeline")
    s3["spec"]["persistence"] = {"s3": {"bucket": "pipelines", "endpoint": "http://127.0.0.1:1",
                                        "credentialsSecret": {"name": "s3-creds"}}}
    ns.apply(s3)
    eventually("the missing Secret reported", lambda: "Secret" in ns.status("s3-pipeline").get("message", ""), 30)
    ns.core.create_namespaced_secret(ns.name, client.V1Secret(metadata=client.V1ObjectMeta(name="s3-creds"),
                                                              string_data={"AWS_ACCESS_KEY_ID": "AKIA-NOT-TO-BE-SEEN"}))
    eventually("the missing key reported",
               lambda: "has no key AWS_SECRET_ACCESS_KEY" in ns.status("s3-pipeline").get("message", ""), 30)
    assert ns.pod("s3-pipeline-driver") is None
    assert "AKIA-NOT-TO-BE-SEEN" not in json.dumps(ns.status("s3-pipeline")) + str(ns.events("s3-pipeline"))


def test_a_misconfigured_driver_is_not_crash_looped_and_a_spec_change_retries_at_once(
        ns: Namespace, operator: Operator) -> None:
    ns.apply(wordcount(application={"file": "examples/missing.py"},
                       restartPolicy={"backoff": {"initialSeconds": 1, "maxSeconds": 600}}))
    eventually("the misconfiguration recorded",
               lambda: ns.status("wordcount").get("lastFailure", {}).get("reason") == "Misconfigured", timeout=60)
    status = ns.status("wordcount")
    assert status["lastFailure"]["exitCode"] == 2
    assert "pipeline file examples/missing.py does not exist" in status["lastFailure"]["message"]
    assert status["phase"] == "Restarting" and status["nextLaunch"]["reason"] == "Misconfigured"
    ns.announced("wordcount", "DriverLost")
    lost = [m for _, r, m in ns.events("wordcount") if r == "DriverLost"]
    assert lost and "does not exist" in lost[0] and "relaunching in 600s" in lost[0]
    time.sleep(6)
    assert ns.pod("wordcount-driver") is None and ns.status("wordcount")["driver"]["epoch"] == 1

    ns.patch("wordcount", {"application": {"file": "examples/still-missing.py"}})
    eventually("an immediate relaunch after the spec change",
               lambda: ns.status("wordcount").get("driver", {}).get("epoch") == 2, timeout=30)


def test_a_second_pipeline_on_the_state_of_another_is_refused_and_creates_no_pod(
        ns: Namespace, operator: Operator) -> None:
    """The older pipeline keeps its state; the newer one names it, and starts once it has
    a path of its own."""
    first = wordcount("first", state="suspended")  # it needs no driver for this
    ns.apply(first)
    eventually("the first suspended", lambda: ns.status("first").get("phase") == "Suspended", timeout=60)
    second = wordcount("second", state="suspended")
    second["spec"]["persistence"] = {"filesystem": {"claimName": "state", "path": f"{ns.name}/first/nested"}}
    second["spec"]["state"] = "running"
    ns.apply(second)
    eventually("the second refused", lambda: ns.status("second").get("phase") == "Invalid", timeout=60)
    status = ns.status("second")
    assert f"overlaps the state of PersistentPipeline {ns.name}/first" in status["message"]
    ns.announced("second", "StateRootConflict")
    assert ns.pod("second-driver") is None
