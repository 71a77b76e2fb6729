"""What users do with kubectl, on the local control plane: suspend and resume, force a
restart with restartNonce, delete with the state retained and re-create to resume."""

from __future__ import annotations

import pytest
from ppl_cluster import Namespace, Operator, eventually, replay, wordcount, write_words

pytestmark = [pytest.mark.cluster, pytest.mark.spark]


def test_suspend_stops_gracefully_resume_continues_and_restart_nonce_restarts(
        ns: Namespace, operator: Operator) -> None:
    data = ns.folder("data")
    write_words(data, "a.csv", ["kiwi", "lime"])
    ns.apply(wordcount())
    eventually("a.csv counted", lambda: replay(data / "result.jsonlines") == {"kiwi": 1, "lime": 1})
    first = ns.driver("wordcount", epoch=1)
    assert first is not None

    ns.patch("wordcount", {"state": "suspended"})
    eventually("suspended", lambda: ns.status("wordcount").get("phase") == "Suspended", timeout=90)
    assert ns.pod("wordcount-driver") is None
    status = ns.status("wordcount")
    assert "lastFailure" not in status and status["restarts"]["total"] == 0
    ns.announced("wordcount", "Stopping", "Suspended")

    write_words(data, "b.csv", ["kiwi"])
    ns.patch("wordcount", {"state": "running"})
    eventually("b.csv counted after the resume", lambda: replay(data / "result.jsonlines") == {"kiwi": 2, "lime": 1})
    assert ns.driver("wordcount", epoch=2) is not None and "Resuming" in ns.event_reasons("wordcount")
    assert ns.status("wordcount")["restarts"]["total"] == 0

    ns.patch("wordcount", {"restartNonce": "please"})
    third = eventually("a driver with epoch 3", lambda: ns.driver("wordcount", epoch=3), timeout=90)
    assert third.metadata.annotations["sparkapp.dev/restart-nonce"] == "please"
    status = ns.status("wordcount")
    assert status["restarts"]["total"] == 1 and status["restarts"]["recent"][-1]["reason"] == "RestartRequested"
    assert "lastFailure" not in status
    write_words(data, "c.csv", ["lime", "mango"])
    eventually("c.csv counted", lambda: replay(data / "result.jsonlines") == {"kiwi": 2, "lime": 2, "mango": 1})


def test_delete_with_retain_keeps_the_state_and_recreating_resumes_from_it(ns: Namespace, operator: Operator) -> None:
    data, state = ns.folder("data"), ns.folder("state")
    write_words(data, "a.csv", ["fig", "fig", "grape"])
    ns.apply(wordcount())
    eventually("a.csv counted", lambda: replay(data / "result.jsonlines") == {"fig": 2, "grape": 1})
    eventually("a checkpoint in status", lambda: ns.status("wordcount").get("checkpoint", {}).get("time"), 30)

    ns.delete("wordcount")
    eventually("the pipeline deleted", lambda: ns.pipeline("wordcount") is None, timeout=120)
    assert ns.pod("wordcount-driver") is None
    assert (state / ns.name / "wordcount" / "log").is_dir(), "the state was not retained"
    ns.announced("wordcount", "StateRetained")

    write_words(data, "b.csv", ["grape", "fig"])
    ns.apply(wordcount())
    eventually("b.csv counted once, a.csv not again",
               lambda: replay(data / "result.jsonlines") == {"fig": 3, "grape": 2}, timeout=300)
    status = ns.status("wordcount")
    # The new resource starts at epoch 1, which the state refuses (stale); the operator
    # relaunches above the stored epoch at once, without counting a failure.
    assert status["driver"]["epoch"] == 2 and status["restarts"]["total"] == 0 and "lastFailure" not in status
    # "Resumed" follows the driver's first report, which the operator may read after the
    # driver has already written its output.
    eventually("the resume announced", lambda: "Resumed" in ns.event_reasons("wordcount"), timeout=60)
    assert "StaleEpoch" in ns.event_reasons("wordcount")


def test_state_in_s3_with_credentials_from_a_secret_is_deleted_with_ondelete_delete(
        ns: Namespace, operator: Operator) -> None:
    s3, s3_spec = ns.s3_bucket_and_secret()
    bucket = s3_spec["bucket"]
    data = ns.folder("data")
    write_words(data, "a.csv", ["nut", "oat", "nut"])
    manifest = wordcount()
    manifest["spec"]["persistence"] = {"snapshotIntervalSeconds": 5, "onDelete": "Delete", "s3": s3_spec}
    ns.apply(manifest)

    driver = eventually("the driver", lambda: ns.driver("wordcount", running=False), timeout=60)
    env = {e.name: e for e in driver.spec.containers[0].env}
    assert env["AWS_SECRET_ACCESS_KEY"].value is None
    assert env["AWS_SECRET_ACCESS_KEY"].value_from.secret_key_ref.name == "s3-creds"
    assert env["SPARK_APP_METADATA_URI"].value == f"s3://{bucket}/{ns.name}/wordcount"
    eventually("a.csv counted", lambda: replay(data / "result.jsonlines") == {"nut": 2, "oat": 1})

    def stored() -> list[str]:
        return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"{ns.name}/wordcount/").get("Contents", [])]

    assert any("/log/" in key for key in stored())
    ns.delete("wordcount")
    eventually("the pipeline deleted after its state", lambda: ns.pipeline("wordcount") is None, timeout=180)
    # Hadoop's empty directory markers ("…/", no data) survive `spark_app reset`: its
    # S3Storage.delete_prefix drops their trailing slash (reported to spark_app).
    assert [key for key in stored() if not key.endswith("/")] == []
    ns.announced("wordcount", "StateCleanup", "StateDeleted")
