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
