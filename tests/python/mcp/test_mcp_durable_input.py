"""A server's request for input as a durable decision (``MCPServer(durable_input=True)``,
``docs/mcp.md``): the server (``mcp_input_server.py``, the ``mcp`` package's server side, over
stdio) answers ``tools/call`` with an input-required result and a state token; the loop logs a
``decision/requested`` of kind ``input`` carrying the server's message, schema and token, and
the turn waits. The client process is killed; the answer comes from another process
(``FileStore.decide``, checked against the schema); a third loop, with a new server process,
makes the call again with the answer and the token from the log."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

pytest.importorskip("mcp")
pytest.importorskip("jsonschema")

from durable_input_child import model, server  # noqa: E402

import kerman  # noqa: E402
from kerman import Answer, Deny, FileStore  # noqa: E402

CHILD = str(Path(__file__).with_name("durable_input_child.py"))

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


def asked_then_killed(root: Path, marker: Path) -> str:
    with subprocess.Popen([sys.executable, CHILD, str(root), str(marker)], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        seen = json.loads(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert seen["status"] == "waiting" and len(seen["decisions"]) == 1
    return seen["decisions"][0]


def events(root: Path) -> List[Any]:
    with FileStore(root).open("s") as log:
        return list(log.events())


def take_up(root: Path, marker: Path) -> str:
    async def main() -> str:
        with FileStore(root).open("s") as log:
            loop = kerman.AgentLoop(model(), log=log, tools=[server(str(marker))])
            assert loop.decisions == []
            loop.wake()
            await loop.when_idle()
            status = loop.status
            await loop.aclose()
            return status

    return asyncio.run(main())


def the_result(all_events: List[Any]) -> str:
    calls = [e for e in all_events if e.type == "tool/call"]
    results = [e.data for e in all_events if e.type == "tool/result"]
    assert [c.data["callId"] for c in calls] == ["c1"] and len(results) == 1
    [block] = results[0]["message"]["content"]
    return "".join(part["text"] for part in block["content"] if part.get("type") == "text")


def test_an_answer_from_another_process_completes_the_call_after_the_client_was_killed(tmp_path: Path) -> None:
    root, marker = tmp_path / "store", tmp_path / "marker.txt"
    decision_id = asked_then_killed(root, marker)
    [request] = [e.data for e in events(root) if e.type == "decision/requested"]
    assert request["kind"] == "input" and request["note"] == "Transfer 5?"
    assert request["schema"]["properties"]["ok"]["type"] == "boolean"
    assert request["payload"]["requestState"] and request["callSeq"] == [e.seq for e in events(root) if e.type == "tool/call"][0]
    assert not marker.exists()  # the server's tool has not finished
    # An answer the schema refuses is refused, naming why; the request stays pending.
    refused = FileStore(root).decide("s", decision_id, Answer({"ok": "yes"}))
    assert refused["applied"] is False and refused["reason"] == "invalid"
    assert FileStore(root).decide("s", decision_id, Answer({"ok": True, "note": "fine"}), by="ann")["applied"] is True
    assert take_up(root, marker) == "idle"
    all_events = events(root)
    assert the_result(all_events) == "transferred 5"
    assert marker.read_text().splitlines() == ["transferred 5"]
    assert [e.data["reason"]["kind"] for e in all_events if e.type == "turn/end"] == ["completed"]


def test_a_declined_request_is_the_call_s_denial_and_the_server_is_not_called_again(tmp_path: Path) -> None:
    root, marker = tmp_path / "store", tmp_path / "marker.txt"
    decision_id = asked_then_killed(root, marker)
    assert FileStore(root).decide("s", decision_id, Deny("not today"))["applied"] is True
    assert take_up(root, marker) == "idle"
    all_events = events(root)
    text = the_result(all_events)
    assert "denied" in text and "not today" in text
    assert not marker.exists()


def test_in_one_process_the_owner_answers_with_loop_decide(tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"

    async def main() -> None:
        loop = kerman.AgentLoop(model(), tools=[server(str(marker))])
        loop.followup("send 5")
        await loop.when_idle()
        assert loop.status == "waiting"
        [pending] = loop.decisions
        assert pending.kind == "input" and pending.schema is not None
        loop.decide(pending.decision_id, Answer({"ok": False, "note": "too much"}))
        await loop.when_idle()
        assert loop.status == "idle"
        assert the_result(list(loop.log.events())) == "not transferred: too much"
        await loop.aclose()

    asyncio.run(main())


def test_several_inputs_asked_at_once_are_one_decision_answered_member_by_member(tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"

    async def main() -> None:
        async def reply(request: kerman.ModelRequest) -> kerman.ModelReply:
            if len(request.messages) > 1:
                return kerman.ModelReply("done")
            return kerman.ModelReply([{"type": "tool-call", "id": "c1", "name": "pay", "arguments": '{"to": "bob"}'}])

        loop = kerman.AgentLoop(reply, tools=[server(str(marker))])
        loop.followup("pay bob")
        await loop.when_idle()
        [pending] = loop.decisions
        assert pending.kind == "input" and pending.schema is not None
        keys = list(pending.schema["properties"])
        assert len(keys) == 2 and pending.schema["required"] == keys
        amount, sure = keys  # the server's keys, in the order it asked
        assert pending.schema["properties"][amount]["properties"]["amount"]["type"] == "integer"
        assert pending.note is not None and pending.note.splitlines() == [f"{amount}: How much to bob?", f"{sure}: Really pay bob?"]
        with pytest.raises(kerman.DecisionError):
            loop.decide(pending.decision_id, Answer({amount: {"amount": 5}}))  # one member missing
        loop.decide(pending.decision_id, Answer({amount: {"amount": 5}, sure: {"ok": True}}))
        await loop.when_idle()
        assert the_result(list(loop.log.events())) == "paid 5 to bob"
        await loop.aclose()

    asyncio.run(main())
