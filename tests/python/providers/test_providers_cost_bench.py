"""The providers' cost benchmarks still run: benches/python/providers_cost.py prints one row per
protocol and history size, providers_long_reply.py one per protocol with its 512 kB / 64 kB
ratio. No timing assertion: benchmarks are programs, not tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benches" / "python" / "providers_cost.py"


@pytest.mark.timeout(300)
def test_the_cost_benchmark_runs():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", "--only", "openai-chat,anthropic"], capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["protocol"], r["messages"]) for r in rows] == [
        ("openai-chat", 10),
        ("openai-chat", 1000),
        ("anthropic", 10),
        ("anthropic", 1000),
    ]
    for r in rows:
        assert r["sdk_us"] > 0 and r["build_us"] > 0 and r["fold_us"] > 0 and r["events"] > 20
        assert r["ratio"] == pytest.approx((r["build_us"] + r["fold_us"]) / r["sdk_us"])


LONG = BENCH.with_name("providers_long_reply.py")


@pytest.mark.timeout(300)
def test_the_long_reply_benchmark_runs():
    done = subprocess.run(
        [sys.executable, str(LONG), "--quick", "--json", "--only", "anthropic"], capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert row["protocol"] == "anthropic" and row["text_512kb"] == 512 * 1024
    assert row["ratio"] == pytest.approx(row["fold_ms_512kb"] / row["fold_ms_64kb"])
