"""The hand-written stubs type-check real usage (mypy --strict) and match the runtime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

USAGE = Path(__file__).parent.parent.parent / "typing" / "usage.py"


def test_usage_type_checks_strictly() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(USAGE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_usage_runs() -> None:
    result = subprocess.run([sys.executable, str(USAGE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "ctx" in result.stdout and "hello" in result.stdout and "goal/change" in result.stdout
    assert "RuntimeError: typed failure" in result.stdout


def test_package_type_checks_strictly() -> None:
    package = Path(__file__).parent.parent.parent.parent / "python" / "kerman"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(package)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
