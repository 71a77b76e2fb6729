"""A driver's termination message becomes the operator's status and Events: the driver
writes it without credentials (the operator scrubs what it reads again)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_app import contract, entrypoint

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.fixture
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    monkeypatch.setenv("SPARK_APP_TERMINATION_LOG", str(path))
    return path


def test_the_driver_scrubs_its_failure_message(termination_log: Path) -> None:
    contract.write_termination_message(f"StorageUnavailable: s3://b/p with AWS_SECRET_ACCESS_KEY={SECRET} (403)",
                                       str(termination_log))
    written = termination_log.read_text()
    assert SECRET not in written
    assert written == f"StorageUnavailable: s3://b/p with AWS_SECRET_ACCESS_KEY={contract.REDACTED} (403)"


def test_the_entrypoint_scrubs_its_own_messages(termination_log: Path) -> None:
    code = entrypoint.run_pipeline("https://user:hunter2@example.com/pipeline.py", [])
    assert code == contract.EXIT_MISCONFIGURED
    assert "hunter2" not in termination_log.read_text()
    assert "pipeline file https://user:[redacted]@example.com/pipeline.py does not exist" in termination_log.read_text()
