"""A user's script with kerman.mcp type-checks under mypy --strict (tests/typing/mcp_usage.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

USAGE = Path(__file__).resolve().parents[2] / "typing" / "mcp_usage.py"


def test_a_users_mcp_script_type_checks_strictly() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(USAGE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
