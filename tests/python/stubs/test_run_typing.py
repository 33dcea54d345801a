"""``loop.run(output_type=T)`` is typed ``RunResult[T]`` for a user's script under ``mypy --strict``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

USAGE = Path(__file__).parent.parent.parent / "typing" / "run_usage.py"


def test_run_result_output_is_typed_under_mypy_strict() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(USAGE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


WRONG = """

async def wrong(loop: kerman.AgentLoop) -> None:
    r = await loop.run("x", output_type=City)
    r.output.no_such_field
"""


def test_a_wrong_output_type_use_is_an_error(tmp_path: Path) -> None:
    """The check can fail: the output used as another type is reported."""
    path = tmp_path / "run_usage_wrong.py"
    path.write_text(USAGE.read_text() + WRONG)
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)], capture_output=True, text=True)
    assert result.returncode == 1 and '"City" has no attribute "no_such_field"' in result.stdout, result.stdout
