"""Which query failures the driver restarts the query for, and which end the driver."""

import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from spark_app.runtime.driver import _looks_transient

# First lines of failures seen in this project's runs.
RESTARTED = [
    # A lower epoch's driver wrote the next batch's offsets before it noticed it was fenced.
    "[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. Multiple streaming jobs detected for 1.",
    "java.net.ConnectException: Connection refused",
    "spark_app.storage.base.StorageUnavailable: s3://bucket/state: 503 Service Unavailable",
    # A Python worker that Spark started did not connect back in time (a loaded node).
    "org.apache.spark.SparkException: Python worker failed to connect back.",
]
FATAL = [
    "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name `wrd` cannot be resolved.",
    "spark_app.state.session.Fenced: superseded: metadata log entry 9 was written by epoch 2",
]


@pytest.mark.parametrize("message", RESTARTED)
def test_failures_that_a_restart_may_get_past_restart_the_query(message: str) -> None:
    assert _looks_transient(message)


@pytest.mark.parametrize("message", FATAL)
def test_other_failures_end_the_driver(message: str) -> None:
    assert not _looks_transient(message)


def test_live_settings_are_read_again_when_their_file_changes_and_a_bad_one_is_ignored(tmp_path) -> None:
    from spark_app.runtime.driver import LiveSettingsFile
    from spark_app.runtime.sources.delta_table import LiveRate

    path = tmp_path / "settings.json"
    live = LiveSettingsFile(str(path))
    assert live.backfill_rate("accounts") is None  # no file yet: nothing set
    path.write_text('{"backfill": {"accounts": {"rowsPerSecond": 0}}}')
    assert live.backfill_rate("accounts") == LiveRate(0.0)
    assert live.backfill_rate("orders") is None
    path.write_text('{"backfill": {"accounts": {"rowsPerSecond": null}}, "x": 1}')
    assert live.backfill_rate("accounts") == LiveRate(None)
    path.write_text('{"backfill": {"accounts": {"rowsPerSecond": "fast"}}}')
    assert live.backfill_rate("accounts") == LiveRate(None)  # the last good settings stay
    assert LiveSettingsFile(None).backfill_rate("accounts") is None


def run_lease_thread(status: Callable[[], object], readers: object = None) -> list[object]:
    """Runs a bare driver's lease thread, with ``status`` and ``readers``, until it has
    renewed three times (or two seconds have passed), then stops it; returns the renewals
    after checking that the thread was still alive."""
    from spark_app.runtime.driver import Driver
    from spark_app.runtime.stop_requests import StopRequests

    renewals: list[object] = []
    driver = object.__new__(Driver)
    driver._stops = StopRequests()  # type: ignore[attr-defined]
    driver._config = SimpleNamespace(lease_ttl_s=0.06)  # type: ignore[attr-defined]
    driver._session = SimpleNamespace(renew_lease=lambda status=None: renewals.append(status))  # type: ignore[attr-defined]
    driver._fatal = None  # type: ignore[attr-defined]
    driver._reporter = None  # type: ignore[attr-defined]
    driver._readers = readers  # type: ignore[attr-defined]
    driver._status = status  # type: ignore[method-assign]
    thread = threading.Thread(target=driver._renew_lease_forever, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if len(renewals) >= 3:
                break
            time.sleep(0.01)
        assert len(renewals) >= 3 and thread.is_alive(), renewals
    finally:
        driver._stops.request("the test is over")  # type: ignore[attr-defined]
        thread.join(5)
    return renewals


def test_a_report_that_fails_never_stops_the_lease_renewal() -> None:
    """The lease thread renews and reports; a report that raises (seen in make demo: the
    Kafka lag read an offset line that was not JSON) must not end the thread, or the live
    driver's lease lapses and the next driver takes over."""

    def failing_status() -> None:
        raise ValueError("Expecting property name enclosed in double quotes")

    run_lease_thread(failing_status)


def test_a_lookup_hold_refresh_that_fails_never_stops_the_lease_renewal() -> None:
    """The lease thread also moves idle lookups' holds on shared tables; a refresh that
    raises (a query's status call while it restarts, a table's log out of reach) must not
    end the thread, as a failing report must not."""
    from spark_app import contract

    refreshes: list[object] = []

    def failing_refresh(busy: object) -> None:
        refreshes.append(busy)
        raise RuntimeError("py4j: the query is being restarted")

    run_lease_thread(lambda: contract.DriverReport(epoch=1, stored_epoch=0, state="running"),
                     SimpleNamespace(refresh_lookups=failing_refresh))
    assert len(refreshes) >= 2, refreshes


def test_a_stale_driver_whose_spark_trips_over_the_newer_driver_s_files_exits_fenced(tmp_path) -> None:
    """A driver frozen while Spark renamed a query's metadata file into place, thawed after
    a newer driver wrote that file, failed ``query.start()`` with Spark's
    FileAlreadyExistsException and exited 1, "failed", although it was only superseded (seen
    in the Kafka sink's stale-driver test). A failure of a driver that a newer epoch has
    superseded is its fencing: it exits fenced and says what it tripped over."""
    from spark_app import contract
    from spark_app.runtime.driver import Driver
    from spark_app.state.identity import Manifest
    from spark_app.state.session import Holder, StateSession
    from spark_app.storage import FilesystemStorage

    storage = FilesystemStorage(str(tmp_path / "state"))
    stale = StateSession.open(storage, Manifest(), holder=Holder.this_process("p"), requested_epoch=1)
    tripped = RuntimeError("org.apache.hadoop.fs.FileAlreadyExistsException: rename destination "
                           "checkpoints/even/metadata already exists")

    def failed_with(error: BaseException) -> tuple[int, str]:
        driver = object.__new__(Driver)
        driver._session = stale  # type: ignore[attr-defined]
        driver._planners = []  # type: ignore[attr-defined]
        driver._queries = {}  # type: ignore[attr-defined]
        driver._reporter = None  # type: ignore[attr-defined]
        termination_log = tmp_path / "termination-log"
        driver._pipeline = SimpleNamespace(  # type: ignore[attr-defined]
            queries={}, environment=SimpleNamespace(termination_log=str(termination_log)))
        return driver._fail(error), termination_log.read_text()

    assert failed_with(tripped)[0] == contract.EXIT_FAILED  # not superseded: a failure

    StateSession.open(storage, Manifest(), holder=Holder.this_process("p"), requested_epoch=2)
    code, message = failed_with(tripped)
    assert code == contract.EXIT_FENCED
    assert message.startswith("driver epoch 1 was superseded: metadata log entry 2 was written by epoch 2"), message
    assert "what it tripped over: RuntimeError: org.apache.hadoop.fs.FileAlreadyExistsException" in message
