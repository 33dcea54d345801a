"""The benches' ``--rounds`` mode (``benches/python/_rounds.py``): event-loop rounds and
Python calls per operation, printed each way with one JSON line (no thresholds: benchmarks
are programs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHES = Path(__file__).resolve().parents[3] / "benches" / "python"


def last_json(*argv: str) -> dict:
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_run_cost_counts_rounds_and_python_calls_per_turn() -> None:
    result = last_json(str(BENCHES / "run_cost.py"), "--rounds", "--turns", "20")
    assert result["bench"] == "run_cost_rounds"
    assert set(result["rows"]) == {"text+usage", "text"}
    for row in result["rows"].values():
        for way in ("followup", "run"):
            # A turn goes round the event loop at least once (its driver is a task) and
            # runs Python code (the model is a Python function).
            assert row[way]["rounds"] >= 1 and row[way]["python_calls"] >= 1


def test_mcp_call_counts_rounds_and_python_calls_per_call() -> None:
    pytest.importorskip("mcp")
    result = last_json(str(BENCHES / "mcp_call.py"), "--rounds", "--calls", "5")
    assert result["bench"] == "mcp_call_rounds"
    for way in ("direct", "loop_client", "loop_mcp", "loop_local", "loop_mcp_no_tasks"):
        assert result[way + "_rounds"] >= 1 and result[way + "_python_calls"] >= 1
        for figure in ("minor_faults", "voluntary_switches", "involuntary_switches", "collections", "user_us", "system_us"):
            assert result[f"{way}_{figure}"] >= 0
    # through kerman is the call through the loop less the turn around the direct call
    for figure in ("rounds", "python_calls", "minor_faults"):
        expected = result["direct_" + figure] + result["loop_mcp_" + figure] - result["loop_client_" + figure]
        assert result["through_kerman_" + figure] == pytest.approx(expected, abs=0.01)
