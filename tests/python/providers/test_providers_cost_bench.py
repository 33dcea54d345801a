"""The providers' cost benchmark (benches/python/providers_cost.py) still runs and prints one
row per protocol and history size. No timing assertion: benchmarks are programs, not tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benches" / "python" / "providers_cost.py"


@pytest.mark.timeout(300)
def test_the_cost_benchmark_runs():
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", "--only", "openai-chat,anthropic"],
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["protocol"], r["messages"]) for r in rows] == [
        ("openai-chat", 10), ("openai-chat", 1000), ("anthropic", 10), ("anthropic", 1000)]
    for r in rows:
        assert r["sdk_us"] > 0 and r["build_us"] > 0 and r["fold_us"] > 0 and r["events"] > 20
        assert r["ratio"] == pytest.approx((r["build_us"] + r["fold_us"]) / r["sdk_us"])
