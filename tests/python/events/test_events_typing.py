"""A user's program reading a streamed turn, a tool call and a failure through kerman.events
type-checks under mypy --strict and prints what the log holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROGRAM = Path(__file__).parent.parent.parent / "typing" / "events.py"


def test_reading_through_views_type_checks_strictly() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(PROGRAM)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_reading_through_views_needs_no_string_key() -> None:
    source = PROGRAM.read_text()
    body = source[source.index("async def run(") : source.index("def main(")]
    assert '["' not in body and ".get(" not in body and ".data" not in body and ".raw" not in body


def test_the_program_reads_the_log() -> None:
    result = subprocess.run([sys.executable, str(PROGRAM)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        'streamed call weather({"city": "Oslo"})',
        "usage 12+4",
        "step 1: 'Checking the weather.' = 'Checking the weather.'",
        "asked for weather (c1)",
        'call c1 weather {"city": "Oslo"}',
        "result c1: Oslo: sunny error=False",
        "usage 12+4",
        "step 2: 'Sunny in Oslo.' = 'Sunny in Oslo.'",
        "turn 1 completed",
        "turn 2 failed: rate limited [RATE_LIMITED, 429]",
        "committed turn 1 completed",
        "committed turn 2 error",
        "tailed result of c1",
    ]
