"""The layering written in pyproject.toml ([tool.importlinter]) holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stdout + result.stderr
