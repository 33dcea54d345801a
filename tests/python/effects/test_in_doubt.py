"""Calls in doubt (``docs/durability.md#calls-in-doubt``): a process is SIGKILLed while a tool
body runs (its ``tool/call`` is flushed, its result is not); a new process opens the file-store
session and resumes it. Each tool body appends a line per execution to a counter file, so the
test counts executions; an independent reading of the log checks one result per call and one
final answer for the input."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from in_doubt_tools import RECONCILED, build

from kerman import FileStore, ModelReply

CHILD = str(Path(__file__).with_name("in_doubt_child.py"))

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


def killed_mid_call(root: Path, counter: Path, tool: str) -> None:
    with subprocess.Popen([sys.executable, CHILD, str(root), "s", str(counter), tool], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "IN_BODY", line
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def executions(counter: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in counter.read_text().splitlines()] if counter.exists() else []


def resume(root: Path, counter: Path) -> List[List[str]]:
    """Opens the session in this process and resumes it; the model's requests (the roles of
    its messages; a tool result is a user message)."""
    requests: List[List[str]] = []

    async def model(request):
        requests.append([m.role for m in request.messages])
        return ModelReply("answered")

    async def main() -> None:
        with FileStore(root).open("s") as log:
            loop = build(model, log, str(counter))
            loop.wake()
            await loop.when_idle()
            await loop.aclose()

    asyncio.run(main())
    return requests


def results(root: Path) -> List[Dict[str, Any]]:
    with FileStore(root).open("s") as log:
        return [e.data for e in log.events() if e.type == "tool/result"]


def text_of(result: Dict[str, Any]) -> str:
    [block] = result["message"]["content"]
    return "".join(part["text"] for part in block["content"])


def check_balanced(root: Path) -> List[Dict[str, Any]]:
    """The independent reading: every tool/call has exactly one tool/result, every turn one
    turn/end; the turn/end payloads."""
    with FileStore(root).open("s") as log:
        events = list(log.events())
    calls = [e.data["callId"] for e in events if e.type == "tool/call"]
    answered = [e.data["message"]["source"]["callId"] for e in events if e.type == "tool/result"]
    assert sorted(calls) == sorted(answered) == sorted(set(calls))
    starts = [e.data["turn"] for e in events if e.type == "turn/start"]
    ends = [e.data for e in events if e.type == "turn/end"]
    assert [e["turn"] for e in ends] == starts
    return ends


@pytest.mark.parametrize("tool", ["look", "put"])
def test_a_retry_tool_runs_again_with_the_same_key(tmp_path: Path, tool: str) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, tool)
    # The store's open leaves the turn open: the call is in doubt and its policy is retry.
    with FileStore(root).open("s") as log:
        assert list(log.events())[-1].type == "tool/call"
    requests = resume(root, counter)
    runs = executions(counter)
    assert [r["tool"] for r in runs] == [tool, tool]
    assert runs[0]["key"] == runs[1]["key"] and runs[0]["key"].startswith("kerman:s:")
    [result] = results(root)
    assert "error" not in result and text_of(result) == f"{tool} ran"
    # The turn went on: one more model request over the logged history, then it completed.
    assert requests == [["user", "assistant", "user"]]
    ends = check_balanced(root)
    assert [e["reason"]["kind"] for e in ends] == ["completed"]


def test_a_write_that_fails_in_doubt_is_closed_as_today(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "send")
    requests = resume(root, counter)
    assert [r["tool"] for r in executions(counter)] == ["send"]
    [result] = results(root)
    assert result["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert requests == []
    assert [e["reason"]["kind"] for e in check_balanced(root)] == ["interrupted"]


def test_a_reconcile_function_gives_the_result_without_running_the_body(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "pay")
    requests = resume(root, counter)
    assert [r["tool"] for r in executions(counter)] == ["pay"]
    [result] = results(root)
    assert "error" not in result and text_of(result) == RECONCILED
    assert requests == [["user", "assistant", "user"]]
    assert [e["reason"]["kind"] for e in check_balanced(root)] == ["completed"]


def test_a_reconcile_function_that_finds_nothing_fails_the_call(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "book")
    requests = resume(root, counter)
    assert [r["tool"] for r in executions(counter)] == ["book"]
    [result] = results(root)
    assert result["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    # The model is told, and the turn ends normally.
    assert requests == [["user", "assistant", "user"]]
    assert [e["reason"]["kind"] for e in check_balanced(root)] == ["completed"]


def test_a_resume_killed_again_mid_retry_retries_again(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "look")
    killed_mid_call(root, counter, "resume")
    requests = resume(root, counter)
    runs = executions(counter)
    assert len(runs) == 3 and len({r["key"] for r in runs}) == 1
    assert len(results(root)) == 1
    assert requests == [["user", "assistant", "user"]]
    assert [e["reason"]["kind"] for e in check_balanced(root)] == ["completed"]


def test_loop_resolve_records_one_result_and_runs_nothing(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "look")

    async def main() -> None:
        with FileStore(root).open("s") as log:
            loop = build(lambda request: ModelReply("unused"), log, str(counter))
            [call] = loop.in_doubt
            assert (call["call_id"], call["name"], call["policy"]) == ("c1", "look", "retry")
            loop.resolve("c1", "looked by hand")
            assert loop.in_doubt == []
            with pytest.raises(ValueError, match='call "c1" is not in doubt'):
                loop.resolve("c1", "again")
            assert not loop.wake()
            await loop.aclose()

    asyncio.run(main())
    assert [r["tool"] for r in executions(counter)] == ["look"]
    [result] = results(root)
    assert "error" not in result and text_of(result) == "looked by hand"
    # Nothing was left for a resume to settle: the turn is closed as the closers close one.
    assert [e["reason"]["kind"] for e in check_balanced(root)] == ["interrupted"]


def test_store_resolve_records_a_failure_for_a_session_no_one_has_open(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "pay")
    store = FileStore(root)
    with pytest.raises(ValueError, match='call "c9" is not in doubt'):
        store.resolve("s", "c9", "nothing")
    store.resolve("s", "c1", "the refund bounced", is_error=True)
    with pytest.raises(ValueError, match='call "c1" is not in doubt'):
        store.resolve("s", "c1", "again")
    assert [r["tool"] for r in executions(counter)] == ["pay"]
    [result] = results(root)
    assert result["error"]["code"] == "TOOL_ERROR" and text_of(result) == "the refund bounced"
    assert [e["reason"]["kind"] for e in check_balanced(root)] == ["interrupted"]


def test_kerman_log_in_doubt_lists_the_call(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "put")
    done = subprocess.run(
        [sys.executable, "-m", "kerman", "log", "in-doubt", str(root), "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert (row["session"], row["call_id"], row["name"], row["effect"], row["policy"]) == ("s", "c1", "put", "idempotent", "retry")
    resume(root, counter)
    done = subprocess.run([sys.executable, "-m", "kerman", "log", "in-doubt", str(root), "s"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no calls in doubt"
