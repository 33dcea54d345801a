"""Repeated tool-call ids (issue 12, item 5): a reply naming one call id twice is refused as
``INVALID_REPLY``, distinct ids still run, and after a crash the closers answer every call of a
repeated id. No test sleeps or measures time."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List

import pytest

from conftest import read_raw_session, session_path, write_raw_session
from kerman import AgentLoop, FileStore, ModelReply, Tool
from kerman.models import ScriptedModel


def run_calls(calls: List[Dict[str, Any]], tools: List[Tool]) -> List[Any]:
    """One turn: the model asks for ``calls``, then says "done"; returns the log's events."""
    return run_calls_with(ModelReply(calls), tools)


def results_of(events: List[Any]) -> List[Dict[str, Any]]:
    return [e.data for e in events if e.type == "tool/result"]


def end_of(events: List[Any]) -> Dict[str, Any]:
    ends = [e.data["reason"] for e in events if e.type == "turn/end"]
    assert len(ends) == 1, ends
    return ends[0]


# ---- item 5: duplicate tool-call ids ------------------------------------------------------


def call(id: str, name: str = "t", arguments: str = "{}") -> Dict[str, Any]:
    return {"type": "tool-call", "id": id, "name": name, "arguments": arguments}


@pytest.mark.parametrize("streamed", [False, True], ids=["reply", "stream"])
@pytest.mark.parametrize("ids", [["c1", "c1"], ["a", "c1", "b", "c1"]], ids=["pair", "among-others"])
def test_a_reply_repeating_a_call_id_is_invalid(streamed, ids):
    """SPEC and the reference are silent on repeated call ids; the decision (issue 12, item 5):
    refused as ``INVALID_REPLY``, naming the id, before anything is logged, rather than renamed,
    so the history stays what the model said."""
    ran: List[Any] = []

    async def body(args, ctx):
        ran.append(ctx.call_id)
        return "ran"

    reply: Any = [call(i) for i in ids] + [{"type": "finish", "reason": "stop"}] if streamed else ModelReply([call(i) for i in ids])
    events = run_calls_with(reply, [Tool("t", body)])
    reason = end_of(events)
    assert reason["kind"] == "error" and reason["error"]["code"] == "INVALID_REPLY", reason
    assert reason["error"]["message"] == ('model reply has two tool calls with id "c1"; tool-call ids must be unique within a reply')
    # Nothing of the reply is a request: no assistant message, no call, no result.
    assert [e.type for e in events if e.type in ("assistant/message", "tool/call", "tool/result")] == []
    assert ran == []


def test_calls_with_distinct_ids_still_run():
    events = run_calls([call("c1"), call("c2")], [Tool("t", lambda args, ctx: "ran")])
    assert [r["message"]["source"]["callId"] for r in results_of(events)] == ["c1", "c2"]
    assert end_of(events) == {"kind": "completed"}


def run_calls_with(reply: Any, tools: List[Tool]) -> List[Any]:
    """One turn: the model gives ``reply``, then says "done"; returns the log's events."""

    async def main() -> List[Any]:
        loop = AgentLoop(ScriptedModel([reply, "done"]), tools=tools)
        loop.followup("hi")
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events

    return asyncio.run(main())


def _crashed_with_repeated_ids(tmp_path: Any, cut_after: str) -> Any:
    """A real session with calls c1, c2 (and a result each), rewritten as if the model had
    named both c1 and the process died (``"call"``: both calls logged, the second without its
    result; ``"message"``: right after the assistant message)."""
    store = FileStore(tmp_path)
    log = store.create("s")

    async def main() -> None:
        loop = AgentLoop(ScriptedModel([ModelReply([call("c1"), call("c2")]), "done"]), log=log, tools=[Tool("t", lambda args, ctx: "ran")])
        loop.followup("hi")
        await loop.when_idle()
        await loop.aclose()

    asyncio.run(main())
    log.close()
    path = session_path(tmp_path, "s")
    records = [rec for _, rec, _ in read_raw_session(path)]
    header, events = records[0], records[1:]
    kinds = [e["type"] for e in events]
    if cut_after == "call":
        end = [i for i, k in enumerate(kinds) if k == "tool/result"][1]  # before the second result
    else:
        end = kinds.index("assistant/message") + 1
    kept = json.loads(json.dumps(events[:end]).replace('"c2"', '"c1"'))
    write_raw_session(path, header, kept)
    return store


@pytest.mark.parametrize("cut_after", ["call", "message"])
def test_closers_answer_every_call_of_a_repeated_id(tmp_path, cut_after):
    store = _crashed_with_repeated_ids(tmp_path, cut_after)
    with store.open("s") as log:
        events = list(log.events())
    message = next(e for e in events if e.type == "assistant/message")
    requested = [b["id"] for b in message.data["message"]["content"] if b["type"] == "tool-call"]
    assert requested == ["c1", "c1"]
    results = [e.data for e in events if e.type == "tool/result"]
    assert len(results) == 2  # exactly one per requested call
    codes = [r.get("error", {}).get("code") for r in results]
    if cut_after == "call":
        # The first call's own result, then the second call (started) gets its closer.
        assert codes == [None, "TOOL_OUTCOME_UNKNOWN"]
        calls = [e.seq for e in events if e.type == "tool/call"]
        assert [e.source_event_seqs for e in events if e.type == "tool/result"][1] == [calls[1]]
    else:
        assert codes == ["TOOL_NOT_STARTED", "TOOL_NOT_STARTED"]
    assert [e.type for e in events][-2:] == ["step/end", "turn/end"]
