"""Which query failures the driver restarts the query for, and which end the driver."""

import pytest

from spark_app.runtime.driver import _looks_transient

# First lines of failures seen in this project's runs.
RESTARTED = [
    # A lower epoch's driver wrote the next batch's offsets before it noticed it was fenced.
    "[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. Multiple streaming jobs detected for 1.",
    "java.net.ConnectException: Connection refused",
    "spark_app.storage.base.StorageUnavailable: s3://bucket/state: 503 Service Unavailable",
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
