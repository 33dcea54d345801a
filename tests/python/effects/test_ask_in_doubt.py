"""``on_in_doubt="ask"`` (``docs/durability.md#calls-in-doubt``): a process is SIGKILLed while
the tool body runs; whoever opens the session next finds a ``decision/requested`` of kind
``in-doubt`` about the call (the crash closers write it), the turn waits, and a decision from
any process (here ``FileStore.decide`` from this one, the owner long dead) gives the call
exactly one result: run again (read and idempotent tools only), a recorded result, or a
recorded failure."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from ask_child import build

import kerman
from kerman import Answer, Approve, Deny, FileStore, ModelReply

CHILD = str(Path(__file__).with_name("ask_child.py"))

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


def killed_mid_call(root: Path, counter: Path, tool: str) -> None:
    with subprocess.Popen([sys.executable, CHILD, str(root), "s", str(counter), tool], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "IN_BODY", line
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def events(root: Path) -> List[Any]:
    with FileStore(root).open("s") as log:
        return list(log.events())


def executions(counter: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in counter.read_text().splitlines()] if counter.exists() else []


def pending_in_another_process(root: Path, counter: Path) -> Dict[str, Any]:
    out = subprocess.run([sys.executable, CHILD, str(root), "s", str(counter), "resume"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_one_result(all_events: List[Any]) -> Dict[str, Any]:
    calls = [e.data["callId"] for e in all_events if e.type == "tool/call"]
    results = [e.data for e in all_events if e.type == "tool/result"]
    assert calls == ["c1"] and [r["message"]["source"]["callId"] for r in results] == ["c1"]
    starts = [e.data["turn"] for e in all_events if e.type == "turn/start"]
    assert [e.data["turn"] for e in all_events if e.type == "turn/end"] == starts
    return results[0]


def text_of(result: Dict[str, Any]) -> str:
    [block] = result["message"]["content"]
    return "".join(part["text"] for part in block["content"])


def take_up(root: Path, counter: Path) -> List[Any]:
    """Opens the session here and lets the loop take the decided step up."""

    async def model(request):
        return ModelReply("answered")

    async def main() -> None:
        with FileStore(root).open("s") as log:
            loop = build(model, log, str(counter))
            assert loop.status == "idle" and loop.decisions == []
            loop.wake()
            await loop.when_idle()
            assert loop.status == "idle"
            await loop.aclose()

    asyncio.run(main())
    return events(root)


def test_the_crash_asks_a_person_and_a_write_tool_is_not_offered_a_rerun(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "ask_write")
    # Another process opens the session: the request is written on open, the turn waits.
    seen = pending_in_another_process(root, counter)
    assert seen["status"] == "waiting" and len(seen["decisions"]) == 1
    [decision_id] = seen["decisions"]
    [request] = [e.data for e in events(root) if e.type == "decision/requested"]
    assert request["decisionId"] == decision_id and request["kind"] == "in-doubt"
    assert request["callId"] == "c1" and request["options"] == ["record-result", "record-failure"]
    call_seq = [e.seq for e in events(root) if e.type == "tool/call"][0]
    assert request["callSeq"] == call_seq
    # Opening again asks nothing more.
    assert [e.type for e in events(root)].count("decision/requested") == 1
    # Running a write tool again is refused, naming why; the request stays pending.
    refused = FileStore(root).decide("s", decision_id, Approve())
    assert refused["applied"] is False and refused["reason"] == "invalid" and "write tool" in refused["detail"]
    answer = FileStore(root).decide("s", decision_id, Answer("paid: receipt 7"), by="ops", key="k1")
    assert answer["applied"] is True
    assert FileStore(root).decide("s", decision_id, Answer("paid: receipt 7"), by="ops", key="k1")["duplicate"] is True
    all_events = take_up(root, counter)
    result = check_one_result(all_events)
    assert "error" not in result and text_of(result) == "paid: receipt 7"
    assert [r["tool"] for r in executions(counter)] == ["ask_write"]  # never run again
    ends = [e.data["reason"]["kind"] for e in all_events if e.type == "turn/end"]
    assert ends == ["completed"]


def test_a_recorded_failure_is_the_call_s_error_result(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "ask_write")
    [decision_id] = pending_in_another_process(root, counter)["decisions"]
    assert FileStore(root).decide("s", decision_id, Deny("the bank has no record"))["applied"] is True
    result = check_one_result(take_up(root, counter))
    assert result["error"]["code"] == "TOOL_ERROR" and "the bank has no record" in text_of(result)
    assert len(executions(counter)) == 1


def test_a_read_tool_may_run_again_with_the_same_key(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "ask_read")
    [decision_id] = pending_in_another_process(root, counter)["decisions"]
    [request] = [e.data for e in events(root) if e.type == "decision/requested"]
    assert request["options"] == ["run-again", "record-result", "record-failure"]
    assert FileStore(root).decide("s", decision_id, Approve(), by="ops")["applied"] is True
    result = check_one_result(take_up(root, counter))
    assert "error" not in result and text_of(result) == "ask_read ran"
    runs = executions(counter)
    assert [r["tool"] for r in runs] == ["ask_read", "ask_read"] and runs[0]["key"] == runs[1]["key"]


def test_the_owner_decides_with_loop_decide_and_the_turn_goes_on(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "ask_write")

    async def model(request):
        return ModelReply("answered")

    async def main() -> None:
        with FileStore(root).open("s") as log:
            loop = build(model, log, str(counter))
            assert loop.status == "waiting"
            [pending] = loop.decisions
            assert pending.kind == "in-doubt" and pending.call_id == "c1" and "write tool" in (pending.note or "")
            with pytest.raises(kerman.DecisionError) as refused:
                loop.decide(pending.decision_id, kerman.Edit({"n": 2}))
            assert refused.value.reason == "invalid"
            loop.decide(pending.decision_id, Answer({"paid": True}))
            await loop.when_idle()
            assert loop.status == "idle" and loop.decisions == []
            await loop.aclose()

    asyncio.run(main())
    result = check_one_result(events(root))
    assert text_of(result) == '{"paid":true}'


def test_kerman_log_shows_the_request_and_in_doubt_lists_its_decision(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "ask_write")
    [decision_id] = pending_in_another_process(root, counter)["decisions"]
    listed = subprocess.run([sys.executable, "-m", "kerman", "log", "in-doubt", str(root), "s"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert f"in-doubt decision {decision_id} pending" in listed.stdout
    shown = subprocess.run([sys.executable, "-m", "kerman", "log", "show", str(root), "s"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "in-doubt? ask_write" in shown.stdout and "record-result, record-failure" in shown.stdout
