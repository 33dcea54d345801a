"""The UI streams of a request about a call that started (``docs/decisions.md#calls-that-
started``): the call was announced by its ``tool/call`` and is not announced again; the AG-UI
run ends with an interrupt whose reason names the kind; both streams validate."""

from __future__ import annotations

import asyncio
from typing import Any, List

from ui_helpers import check_agui_event, check_vercel_part

import kerman
from kerman import Answer, InputRequired, ModelReply, Tool
from kerman.ui import agui, vercel

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def waited_and_answered() -> List[Any]:
    async def model(request):
        if len(request.messages) > 1:
            return ModelReply("done")
        return ModelReply([{"type": "tool-call", "id": "c1", "name": "transfer", "arguments": '{"amount": 5}'}])

    async def transfer(args, ctx):
        if ctx.input is None:
            return InputRequired("Transfer 5?", SCHEMA, {"token": "t1"})
        assert ctx.input["payload"] == {"token": "t1"}
        return f"ok={ctx.input['answer']['ok']}"

    async def main() -> List[Any]:
        loop = kerman.AgentLoop(model)
        loop.tool(Tool("transfer", transfer))
        loop.followup("go")
        await loop.when_idle()
        [pending] = loop.decisions
        assert pending.kind == "input" and pending.schema == SCHEMA and pending.note == "Transfer 5?"
        loop.decide(pending.decision_id, Answer({"ok": True}))
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events

    return asyncio.run(main())


def test_the_log_holds_one_call_one_request_one_result() -> None:
    events = waited_and_answered()
    kinds = [e.type for e in events if e.type.startswith(("tool/", "decision/"))]
    assert kinds == ["tool/call", "decision/requested", "decision/resolved", "tool/result"]
    [request] = [e for e in events if e.type == "decision/requested"]
    view = kerman.events.view(request)
    assert view.kind == "input" and view.call_seq == [e.seq for e in events if e.type == "tool/call"][0]
    assert view.options == ["answer", "decline"] and view.payload == {"token": "t1"}


def test_agui_announces_the_call_once_and_interrupts_with_the_kind() -> None:
    out = [u.data for u in agui(waited_and_answered())]
    for data in out:
        check_agui_event(data)
    assert [d["type"] for d in out].count("TOOL_CALL_START") == 1
    [finished] = [d for d in out if d["type"] == "RUN_FINISHED" and d["outcome"]["type"] == "interrupt"]
    [interrupt] = finished["outcome"]["interrupts"]
    assert interrupt["reason"] == "tool_input" and interrupt["responseSchema"] == SCHEMA
    [result] = [d for d in out if d["type"] == "TOOL_CALL_RESULT"]
    assert result["content"] == "ok=True"


def test_vercel_shows_the_call_once_and_the_decision_as_data() -> None:
    out = [u.data for u in vercel(waited_and_answered())]
    for part in out:
        check_vercel_part(part)
    assert [p["type"] for p in out].count("tool-input-available") == 1
    decisions = [p for p in out if p["type"] == "data-decision"]
    assert [d["data"]["status"] for d in decisions] == ["pending", "answered"]
    assert not any(p["type"] == "tool-approval-request" for p in out)
