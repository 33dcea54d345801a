"""The ``run()`` cost benchmark runs and reports one row per model latency (no timing
assertions: benchmarks are programs, ``make bench``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "benches" / "python" / "run_cost.py"


def test_run_cost_bench_prints_its_rows() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--turns", "60", "--reps", "1", "--model-ms", "0", "0.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["bench"] == "run_cost"
    # One row per model latency and reading (the text and priced usage, or the text alone).
    readings = [(row["model_ms"], row["reading"]) for row in result["rows"]]
    assert readings == [(0.0, "text+usage"), (0.0, "text"), (0.5, "text+usage"), (0.5, "text")]
    assert all(row["ratio"] > 0 and set(row["us_per_turn"]) == {"followup", "run"} for row in result["rows"])
