"""benches/python/turn_cost.py's workload runs for both implementations (the callgrind part is
a benchmark, not a test: ``make bench-instr``)."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benches" / "python" / "turn_cost.py"


@pytest.mark.parametrize("impl", ["kerman", "baseline"])
@pytest.mark.parametrize("listeners,tool", [(0, 0), (1, 0), (5, 0), (0, 1)])
def test_turn_cost_workload_runs(impl, listeners, tool):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--child", impl, str(listeners), str(tool), "200"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_turn_cost_refuses_bad_sizes():
    done = subprocess.run([sys.executable, str(SCRIPT), "--turns", "3000,1000"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--turns needs two increasing multiples of 100" in done.stderr or "valgrind" in done.stderr


def test_the_crossings_probe_counts_the_user_calls_and_no_loop_attributes():
    """benches/python/crossings.py (``make bench``): the model and the tool are the user calls
    of a P3 and a P4 turn, and the native driver reads no attribute of the AgentLoop."""
    import json

    probe = SCRIPT.parent / "crossings.py"
    done = subprocess.run([sys.executable, str(probe), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert (counts["P3"]["user"], counts["P4"]["user"]) == (1, 3)
    assert counts["P3"]["attributes"] == counts["P4"]["attributes"] == 0
    assert counts["P4"]["total"] <= counts["P4"]["user"] + 5
