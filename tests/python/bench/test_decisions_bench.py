"""``benches/python/decisions_bench.py`` (bench.py's ``gate`` and ``decide`` rows) still runs and
reports every figure. No timing assertions: benchmarks are programs, not tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PG_DSN, fresh_schema_dsn

BENCH = Path(__file__).resolve().parents[3] / "benches" / "python" / "decisions_bench.py"


@pytest.mark.timeout(300)
def test_the_decisions_bench_reports_the_gate_and_every_latency() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KERMAN_PG_DSN"}
    if PG_DSN:
        env["KERMAN_PG_DSN"] = fresh_schema_dsn()
    done = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=280, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    gate = result["gate"]
    assert gate["plain_turns_s"] > 0 and gate["gated_turns_s"] > 0
    assert gate["share_of_p4_turn"] == pytest.approx(gate["gate_ns_per_turn"] / (1e9 / gate["plain_turns_s"]))
    decide = result["decide"]
    expected = {"memory", "file", "file_cross"} | ({"postgres_cross"} if PG_DSN else set())
    assert set(decide) == expected
    for name in ("memory", "file"):
        assert decide[name]["n"] == 30 and 0 < decide[name]["p50_us"] <= decide[name]["p99_us"]
    for name in expected - {"memory", "file"}:
        for part in ("tool", "decide_call"):
            assert decide[name][part]["n"] == 30 and 0 < decide[name][part]["p50_us"] <= decide[name][part]["p99_us"]
