"""A decision pending in the log outlives its process: the loop is closed (or the process is
killed with SIGKILL) while a call waits, then another process reopens the file-store session
and decides. The call runs exactly once, with the decided arguments, and the model is asked
only for the step after it (docs/decisions.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

CHILD = str(Path(__file__).with_name("decisions_child.py"))


def child(*args: str) -> str:
    done = subprocess.run([sys.executable, CHILD, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def runs(counter: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in counter.read_text().splitlines()] if counter.exists() else []


def decide_in_another_process(root: Path, counter: Path, decision_id: str, how: str) -> Dict[str, Any]:
    summary = json.loads(child("decide", str(root), "s", str(counter), decision_id, how))
    # Listed by the new process, which waited for the decision, not for the model.
    assert summary["before"] == [[decision_id, "waiting"]]
    # One request: the one after the tool result (user, assistant call, tool result).
    assert len(summary["requests"]) == 1
    assert summary["ends"] == ["completed"]
    assert summary["status"] == "idle"
    return summary


def test_closed_while_waiting_then_decided_in_a_new_process(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    decision_id = child("ask", str(root), "s", str(counter), "close")
    assert runs(counter) == []
    decide_in_another_process(root, counter, decision_id, '{"amount": 3}')
    assert runs(counter) == [{"amount": 3}]
    # Deciding again from yet another process: the same key is applied once, nothing runs.
    again = subprocess.run(
        [sys.executable, CHILD, "decide", str(root), "s", str(counter), decision_id, "approve"], capture_output=True, text=True, timeout=60
    )
    assert runs(counter) == [{"amount": 3}]
    assert again.returncode == 0 or "DecisionError" in again.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_killed_while_waiting_then_decided_in_another_process(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    with subprocess.Popen(
        [sys.executable, CHILD, "ask", str(root), "s", str(counter), "hang"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            decision_id = proc.stdout.readline().strip()
            assert decision_id
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert runs(counter) == []
    decide_in_another_process(root, counter, decision_id, "approve")
    assert runs(counter) == [{"amount": 5}]
