"""Parity, part 3: tool calls, run against Kerman and against the benchmarks' pure-Python
baseline (the ``api`` fixture, ``--impl``; see conftest.py).

P4's shape first: step 1 asks for one tool call, step 2 answers (reference 5.12 B). Then what a
tool turn may meet on the way: steering staged by the tool (5.12 C), an unknown or raising tool
(SPEC 2.5, 4.6), and several calls in one reply.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
from parity_helpers import SPLICED, STEP, Minted, amsg, asynctest, call, msg, records, same, scripted, tool_msg, turn_ends, types


@asynctest
async def test_one_tool_call_per_turn_logs_exactly_these_events(api):
    tool_call = call("call-1", "git_log", {"n": 1})
    model = scripted(api, [tool_call], api.ModelReply("The last commit adds group commit."))
    loop = api.AgentLoop(model)
    contexts: List[Any] = []

    async def git_log(args: Dict[str, Any], ctx: Any) -> str:
        """Shows the log."""
        contexts.append((args, ctx.call_id, ctx.turn, ctx.step, ctx.loop is loop))
        return "commit 4f1c2e: add group commit"

    loop.tool(git_log)
    loop.followup(api.UserMessage("What changed?", id="p"))
    await loop.when_idle()
    assert contexts == [({"n": 1}, "call-1", 1, 1, True)]
    m = Minted()
    result = tool_msg("<m2>", "call-1", "commit 4f1c2e: add group commit")
    same(
        records(loop.log, 3, minted=m),
        [
            {"type": "step/start", "seq": 3, "data": {"turn": 1, "step": 1}},
            {"type": "user/message", "seq": 4, "data": msg("p", "What changed?"), "surfaceOp": "append"},
            {"type": "request/header", "seq": 5, "data": {"options": {}}},
            {
                "type": "assistant/message",
                "seq": 6,
                "data": {"turn": 1, "step": 1, "message": amsg("<m1>", [tool_call])},
                "sourceEventSeqs": [],
                "surfaceOp": "append",
            },
            {"type": "tool/call", "seq": 7, "data": {"turn": 1, "step": 1, "callId": "call-1", "name": "git_log", "arguments": '{"n": 1}'}},
            {
                "type": "tool/result",
                "seq": 8,
                "data": {"turn": 1, "step": 1, "message": result},
                "sourceEventSeqs": [7],
                "surfaceOp": "append",
            },
            {"type": "step/end", "seq": 9, "data": {"turn": 1, "step": 1}},
            {"type": "step/start", "seq": 10, "data": {"turn": 1, "step": 2}},
            {
                "type": "assistant/message",
                "seq": 11,
                "data": {"turn": 1, "step": 2, "message": amsg("<m3>", "The last commit adds group commit.")},
                "sourceEventSeqs": [],
                "surfaceOp": "append",
            },
            {"type": "step/end", "seq": 12, "data": {"turn": 1, "step": 2}},
            {"type": "turn/end", "seq": 13, "data": {"turn": 1, "reason": {"kind": "completed"}}},
        ],
    )
    same(
        m(model.requests),
        [
            {"turn": 1, "step": 1, "messages": [msg("p", "What changed?")], "entered": ["p"]},
            {"turn": 1, "step": 2, "messages": [msg("p", "What changed?"), amsg("<m1>", [tool_call]), result], "entered": []},
        ],
    )


@asynctest
async def test_requests_carry_the_tool_specs(api):
    seen: List[Any] = []

    async def model(request: Any) -> Any:
        seen.append(request.tools)
        return api.ModelReply("ok")

    loop = api.AgentLoop(model)

    async def lookup(args: Dict[str, Any], ctx: Any) -> str:
        """Looks things up."""
        return "found"

    assert loop.tool(lookup) is lookup
    loop.followup("go")
    await loop.when_idle()
    same(seen, [[{"name": "lookup", "description": "Looks things up.", "parameters": {"type": "object", "properties": {}}}]])


@asynctest
async def test_steering_staged_by_a_tool_enters_at_the_next_step(api):
    """Reference 5.12 C."""
    model = scripted(api, [call("c1", "work")], "done")
    loop = api.AgentLoop(model)

    async def work(args: Dict[str, Any], ctx: Any) -> str:
        ctx.loop.steer(api.UserMessage("S", id="s"))
        return "ok"

    loop.tool(work)
    loop.followup(api.UserMessage("A", id="a"))
    await loop.when_idle()
    m = Minted()
    recs = records(loop.log, minted=m)
    same(
        recs[7:14],
        [
            {"type": "tool/call", "seq": 7, "data": {"turn": 1, "step": 1, "callId": "c1", "name": "work", "arguments": "{}"}},
            {"type": SPLICED, "seq": 8, "data": {"target": STEP, "start": 0, "inserted": [msg("s", "S")]}},
            {
                "type": "tool/result",
                "seq": 9,
                "data": {"turn": 1, "step": 1, "message": tool_msg("<m2>", "c1", "ok")},
                "sourceEventSeqs": [7],
                "surfaceOp": "append",
            },
            {"type": "step/end", "seq": 10, "data": {"turn": 1, "step": 1}},
            {"type": SPLICED, "seq": 11, "data": {"target": STEP, "start": 0, "removedCount": 1, "inserted": []}},
            {"type": "step/start", "seq": 12, "data": {"turn": 1, "step": 2}},
            {"type": "user/message", "seq": 13, "data": msg("s", "S"), "surfaceOp": "append"},
        ],
    )
    assert [r["entered"] for r in model.requests] == [["a"], ["s"]]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]


class ToolBroke(Exception):
    pass


@pytest.mark.parametrize(
    "name, text, error",
    [
        ("nope", "unknown tool 'nope'", {"name": "UnknownToolError", "code": "UNKNOWN_TOOL"}),
        ("fragile", "bad input: 42", {"name": "ToolBroke", "code": "TOOL_ERROR"}),
    ],
)
@asynctest
async def test_an_unknown_or_raising_tool_gives_an_error_result_and_the_turn_goes_on(api, name, text, error):
    model = scripted(api, [call("c1", name, {"x": 1})], "carried on")
    loop = api.AgentLoop(model)

    async def fragile(args: Dict[str, Any], ctx: Any) -> str:
        raise ToolBroke("bad input: 42")

    loop.tool(fragile)
    loop.followup("go")
    await loop.when_idle()
    m = Minted()
    (result,) = [r for r in records(loop.log, minted=m) if r["type"] == "tool/result"]
    same(
        result,
        {
            "type": "tool/result",
            "seq": 8,
            "data": {"turn": 1, "step": 1, "message": tool_msg("<m3>", "c1", text, is_error=True), "error": error},
            "sourceEventSeqs": [7],
            "surfaceOp": "append",
        },
    )
    assert [r["step"] for r in model.requests] == [1, 2]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]


@asynctest
async def test_several_calls_are_logged_then_their_results_in_model_order(api):
    model = scripted(api, [call("c1", "slow"), call("c2", "fast")], "done")
    loop = api.AgentLoop(model)

    async def slow(args: Dict[str, Any], ctx: Any) -> str:
        return "slow result"

    async def fast(args: Dict[str, Any], ctx: Any) -> str:
        return "fast result"

    loop.tool(slow)
    loop.tool(fast)
    loop.followup("go")
    await loop.when_idle()
    step1 = [
        (e.type, e.data.get("callId") or e.data["message"]["source"]["callId"]) for e in loop.log.events(types=["tool/call", "tool/result"])
    ]
    assert step1 == [("tool/call", "c1"), ("tool/call", "c2"), ("tool/result", "c1"), ("tool/result", "c2")]
    results = list(loop.log.events(types=["tool/result"]))
    assert [e.data["message"]["content"][0]["content"][0]["text"] for e in results] == ["slow result", "fast result"]
    assert types(loop.log)[-4:] == ["step/start", "assistant/message", "step/end", "turn/end"]


@pytest.mark.baseline_shortcut(
    "tool calls are not scheduled (reference 5.8): several calls are gathered, so results are logged after every tool/call"
)
@asynctest
async def test_an_unknown_tool_result_is_logged_before_the_next_call_starts(api):
    model = scripted(api, [call("c1", "nope"), call("c2", "known")], "done")
    loop = api.AgentLoop(model)

    async def known(args: Dict[str, Any], ctx: Any) -> str:
        return "ok"

    loop.tool(known)
    loop.followup("go")
    await loop.when_idle()
    assert types(loop.log)[7:11] == ["tool/call", "tool/result", "tool/call", "tool/result"]
