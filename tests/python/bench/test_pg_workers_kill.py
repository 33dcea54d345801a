"""The distributed benchmark's kill phase at a small scale (``benches/python/pg_workers.py``,
docs/performance.md): ``kerman worker`` processes over PostgreSQL serve a few dozen messages
across several sessions; when the burst begins, the first model call blocks (the load generator
creates the file the benchmark's model claims) and the benchmark SIGKILLs that worker inside the
call. Its reader of the tables, independent of Kerman, counts final answers per entered message
and the write tool's own file counts its executions: every message answered exactly once, no
write tool run twice. The default run is small; ``KERMAN_SLOW=1`` runs a larger one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import PG_DSN, needs_postgres

BENCH = Path(__file__).resolve().parents[3] / "benches" / "python" / "pg_workers.py"
SLOW = os.environ.get("KERMAN_SLOW") == "1"

pytestmark = [needs_postgres, pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")]


def run_bench(*args: str, timeout: float) -> Dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(BENCH), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "KERMAN_PG_DSN": PG_DSN, "BENCH_QUIET": "1"},
    )
    assert done.stdout.strip(), done.stderr
    report = json.loads(done.stdout)
    assert done.returncode == (0 if report["audit"]["ok"] else 1), done.stderr
    return report


def check(report: Dict[str, Any]) -> None:
    kill, audit = report["kill"], report["audit"]
    assert kill["in_model_call"] and kill["during_burst"] and kill["burst_messages_served_after_the_kill"] > 0, kill
    assert kill["answered_once"] == kill["messages_of_the_blocked_call"], kill
    assert audit["ok"], audit
    assert audit["entered_once"] == audit["answered_once"] == audit["messages"], audit
    assert audit["unanswered"] == audit["answered_twice"] == 0, audit
    assert audit["write_tool_calls"] > 0 and audit["write_tool_ran_twice"] == 0, audit
    assert audit["write_tool_ran_without_its_call"] == 0 and audit["left_staged"] == 0, audit


@pytest.mark.timeout(170)
def test_a_worker_killed_inside_a_model_call_during_the_burst_loses_no_answer() -> None:
    report = run_bench(
        "--workers", "2", "--sessions", "8", "--hot-sessions", "2", "--generators", "1", "--rate", "20", "--seconds", "1",
        "--burst", "30", "--lease-ttl", "1", "--idle-timeout", "3", "--tool-share", "0.3", "--listen-counts", "",
        "--model-delay", "0.01",
        timeout=160,
    )  # fmt: skip
    check(report)


@pytest.mark.skipif(not SLOW, reason="the larger kill phase runs with KERMAN_SLOW=1")
@pytest.mark.timeout(600)
def test_the_kill_phase_at_a_larger_scale() -> None:
    report = run_bench(
        "--workers", "3", "--sessions", "300", "--hot-sessions", "20", "--generators", "2", "--rate", "100", "--seconds", "3",
        "--burst", "300", "--lease-ttl", "1", "--idle-timeout", "3", "--tool-share", "0.2", "--listen-counts", "1",
        timeout=580,
    )  # fmt: skip
    check(report)
