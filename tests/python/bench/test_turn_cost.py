"""benches/python/turn_cost.py's workload runs for both implementations (the callgrind part is
a benchmark, not a test: ``make bench-instr``)."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benches" / "python" / "turn_cost.py"


@pytest.mark.parametrize("impl", ["kerman", "baseline"])
@pytest.mark.parametrize("listeners,tool", [(0, 0), (1, 0), (0, 1)])
def test_turn_cost_workload_runs(impl, listeners, tool):
    done = subprocess.run([sys.executable, str(SCRIPT), "--child", impl, str(listeners), str(tool), "200"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_turn_cost_refuses_bad_sizes():
    done = subprocess.run([sys.executable, str(SCRIPT), "--turns", "3000,1000"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert "--turns needs two increasing multiples of 100" in done.stderr or "valgrind" in done.stderr
