"""Batch folders a driver killed mid-fetch leaves behind are removed by the next one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spark_app.runtime.jvm.changelog_encoder import sweep_once


def test_the_folders_of_ended_drivers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(ended.stdout)
    (tmp_path / f"spark_app-batch-{dead_pid}-k2x9").mkdir()
    (tmp_path / f"spark_app-batch-{dead_pid}-k2x9" / "part-00000").write_bytes(b"\0" * 100)
    (tmp_path / f"spark_app-batch-{os.getpid()}-a1b2").mkdir()
    (tmp_path / "spark_app-batch-notapid").mkdir()
    (tmp_path / "blockmgr-1234").mkdir()

    assert sweep_once(str(tmp_path)) == [f"spark_app-batch-{dead_pid}-k2x9"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"spark_app-batch-{os.getpid()}-a1b2", "spark_app-batch-notapid", "blockmgr-1234"])
