"""Start-up errors in one sentence; graceful stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import time

import pytest

from spark_app import contract
from tests.integration.spark_app.harness import Workspace, fold, multiset, read_changelog, write_csv
from tests.integration.spark_app.words import expected_counts, expected_even, rows, wait_for_files

pytestmark = pytest.mark.spark


def test_a_missing_bucket_fails_at_start_up_in_one_sentence(tmp_path, s3_server) -> None:  # type: ignore[no-untyped-def]
    workspace = Workspace(tmp_path, "s3://no-such-bucket/p", s3_server.endpoint_url)
    driver = workspace.driver().start()
    assert driver.wait() == contract.EXIT_MISCONFIGURED
    assert driver.termination_message() == (
        f"the bucket no-such-bucket does not exist at {s3_server.endpoint_url}; create it or fix the bucket name")


def test_an_unwritable_state_path_fails_at_start_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "file").write_text("in the way")
    workspace = Workspace(tmp_path, str(tmp_path / "file" / "state"))
    driver = workspace.driver().start()
    assert driver.wait() == contract.EXIT_MISCONFIGURED
    assert "is not writable" in driver.termination_message()


def test_sigterm_commits_and_exits_zero_within_the_grace_period(fs_workspace: Workspace) -> None:
    for f in range(3):
        write_csv(fs_workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
    driver = fs_workspace.driver().start()
    driver.wait_for_log("committed batch")
    write_csv(fs_workspace.inputs, "part-3.csv", "word,n", rows(3))
    time.sleep(0.5)
    started = time.monotonic()
    driver.terminate()
    assert driver.wait(30) == 0
    assert time.monotonic() - started < 25
    assert "stopped cleanly" in driver.output()
    again = fs_workspace.driver("--stop-when-idle").start()
    assert again.wait() == 0
    assert "taking over" not in again.output()  # the lease was released, not left to expire
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(4))


def test_sigterm_to_the_drivers_whole_process_group_commits_and_exits_zero(fs_workspace: Workspace) -> None:
    """As GNU timeout sends it (the process, then its group), as systemd's default kill mode
    and `kill -- -PGID` send it: the driver's JVM is in the group too. It ran Spark's shutdown
    beside the driver's own stop, which then failed ("pipeline failed", no final snapshot)."""
    for f in range(2):
        write_csv(fs_workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
    driver = fs_workspace.driver().start()
    driver.wait_for_log("committed batch")
    assert driver.process is not None
    os.kill(driver.process.pid, signal.SIGTERM)
    os.killpg(driver.process.pid, signal.SIGTERM)
    assert driver.wait(60) == 0, driver.output()[-3000:]
    assert "stopped cleanly" in driver.output()
    assert fold(read_changelog(fs_workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(2))


@pytest.mark.long  # make test: SIGTERM's grace above, an outage ridden out below, and the operator's outage test
def test_sigterm_in_a_storage_outage_ends_the_driver_within_the_grace_period(s3_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM while S3 is unreachable (a pod deleted or a node drained during an outage):
    nothing more can be committed, so the driver ends within Kubernetes' default grace
    period of 30 s with EXIT_STORAGE_UNAVAILABLE, instead of retrying its stop's writes
    until it is killed; once S3 is back the next driver resumes exactly."""
    from tests.support.outage import Outage

    outage = Outage(s3_server.endpoint_url, tmp_path / "outage.log")
    outage.start()
    workspace = Workspace(tmp_path, f"s3://{s3_server.new_bucket()}/p", outage.url)
    try:
        write_csv(workspace.inputs, "part-0.csv", "word,n", rows(0))
        driver = workspace.driver("--outage-budget-s", "15").start()
        driver.wait_for_log("words: 1 files")
        outage.stop()
        write_csv(workspace.inputs, "part-1.csv", "word,n", rows(1))  # a batch that cannot commit
        time.sleep(3)
        began = time.monotonic()
        driver.terminate()
        code = driver.wait(120)
        took = time.monotonic() - began
        print(f"SIGTERM in the outage: exit {code} after {took:.1f}s")
        assert code == contract.EXIT_STORAGE_UNAVAILABLE, driver.output()[-3000:]
        assert "while the state's storage is unreachable" in driver.termination_message()
        assert took < 30, f"the stop took {took:.0f}s: {driver.output()[-3000:]}"
        outage.start()
        write_csv(workspace.inputs, "part-2.csv", "word,n", rows(2))
        again = workspace.driver("--stop-when-idle").start()
        assert again.wait() == 0, again.output()[-3000:]
    finally:
        workspace.kill_all()
        outage.stop()
    assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(3))


def test_a_storage_outage_mid_run_is_ridden_out_and_the_output_stays_exact(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from moto.server import ThreadedMotoServer

    from localcluster.procs import free_port
    from tests.support.s3 import TEST_CREDENTIALS

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]).create_bucket(Bucket="outage")
    workspace = Workspace(tmp_path, "s3://outage/p", endpoint)
    write_csv(workspace.inputs, "part-0.csv", "word,n", rows(0))
    driver = workspace.driver(env=TEST_CREDENTIALS).start()
    try:
        driver.wait_for_log("committed batch")
        server.stop()
        for f in range(1, 4):
            write_csv(workspace.inputs, f"part-{f}.csv", "word,n", rows(f))
        time.sleep(15)  # the storage is down: the driver retries with backoff
        assert driver.process.poll() is None, driver.output()[-3000:]  # type: ignore[union-attr]
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        wait_for_files(driver, 4, timeout=240)
        driver.terminate()
        assert driver.wait(60) == 0
    finally:
        driver.kill()
        server.stop()
    # S3A's retries inside the stalled batch, spark_app's storage retries and, for longer
    # outages, restarts of the query from its last commit all resume without loss.
    assert fold(read_changelog(workspace.out / "counts.jsonlines"), ("word",)) == expected_counts(range(4))
    assert multiset(read_changelog(workspace.out / "even.jsonlines")) == expected_even(range(4))
