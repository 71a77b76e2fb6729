"""Deterministic crash points for the recovery tests.

``SPARK_APP_FAULT=<point>:<batch>`` kills the driver (its whole process group, JVM
included, as a lost node would) when it reaches ``point`` for that batch. Random kills
rarely land in the narrow windows that matter most, such as between spark_app's commit
and Spark's own commit-log entry; these points make those windows testable.
"""

from __future__ import annotations

import os
import signal

FAULT = "SPARK_APP_FAULT"
AFTER_OUTPUT = "after-output"
"""The batch's output is written but not committed."""
AFTER_COMMIT = "after-commit"
"""The batch is committed in the metadata log, but Spark has not recorded it."""
AFTER_SNAPSHOT_COMMIT = "after-snapshot-commit"
"""A new output snapshot is committed; the previous one is not deleted yet."""
IN_ITERATION = "in-iteration"
"""An iterate operator has finished an iteration of the batch's fixed point, not the last."""


def crash_point(point: str, batch_id: int) -> None:
    if os.environ.get(FAULT) == f"{point}:{batch_id}":
        os.killpg(os.getpgrp(), signal.SIGKILL)
