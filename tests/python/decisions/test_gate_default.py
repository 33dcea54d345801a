"""The gate's default without a call into Python (docs/decisions.md, "What a gate costs"): a
tool whose ``needs_approval`` is a bool is gated by the loop itself; only a predicate (or a tool
without the attribute) goes through the façade's ``default_gate``. What runs, what is asked and
what ``next()`` gives a listener are the same either way."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List

import pytest

import kerman
import kerman.loop
from kerman import AgentLoop, Approve, Ask, ModelReply
from kerman.models import ScriptedModel


def calls(*items: Any) -> ModelReply:
    return ModelReply([{"type": "tool-call", "id": i, "name": n, "arguments": json.dumps(a)} for i, n, a in items])


@pytest.fixture
def default_calls(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """The calls of the tools' names ``default_gate`` gets (for loops made after the patch)."""
    seen: List[str] = []
    real = kerman.loop._default_gate

    def counting(call: Any) -> Any:
        seen.append(call.name)
        return real(call)

    monkeypatch.setattr(kerman.loop, "_default_gate", counting)
    return seen


def tool(name: str, ran: List[str], **kw: Any) -> kerman.Tool:
    async def body(args: Dict[str, Any], ctx: Any) -> str:
        ran.append(name)
        return f"{name} ok"

    return kerman.Tool(name, body, **kw)


def test_a_constant_needs_approval_is_gated_without_the_default_gate(default_calls: List[str]) -> None:
    async def main() -> None:
        ran: List[str] = []
        tools = [tool("ask", ran, needs_approval=True), tool("free", ran)]
        loop = AgentLoop(ScriptedModel([calls(("c1", "ask", {"a": 1}), ("c2", "free", {}), ("c3", "nope", {})), "done"]), tools=tools)
        loop.followup("go")
        await loop.when_idle()
        assert loop.status == "waiting"
        [pending] = loop.decisions
        assert (pending.call_id, pending.name, pending.kind, pending.note, pending.schema, pending.expires_at) == (
            "c1",
            "ask",
            "approval",
            None,
            None,
            None,
        )
        assert ran == ["free"]  # it needs no decision: it ran while the step waits
        loop.decide(pending.decision_id, Approve())
        await loop.when_idle()
        assert ran == ["free", "ask"]
        assert default_calls == []

    asyncio.run(main())


def test_a_predicate_still_goes_through_the_default_gate(default_calls: List[str]) -> None:
    async def main() -> None:
        ran: List[str] = []
        asked: List[Any] = []

        def needs(call: kerman.ToolCall) -> bool:
            asked.append(call.arguments)
            return bool(call.arguments["a"])

        loop = AgentLoop(
            ScriptedModel([calls(("c1", "t", {"a": 0}), ("c2", "t", {"a": 1})), "done"]), tools=[tool("t", ran, needs_approval=needs)]
        )
        loop.followup("go")
        await loop.when_idle()
        assert asked == [{"a": 0}, {"a": 1}]
        assert default_calls == ["t", "t"]
        assert [p.call_id for p in loop.decisions] == ["c2"]

    asyncio.run(main())


def test_next_gives_a_listener_what_the_default_gate_would(default_calls: List[str]) -> None:
    async def main() -> None:
        ran: List[str] = []
        given: List[Any] = []
        tools = [tool("ask", ran, needs_approval=True), tool("free", ran), tool("pred", ran, needs_approval=lambda call: False)]
        loop = AgentLoop(ScriptedModel([calls(("c1", "free", {}), ("c2", "ask", {}), ("c3", "pred", {})), "done"]), tools=tools)

        @loop.before_tool
        async def gate(call: kerman.ToolCall, next: Any) -> Any:
            verdict = await next()
            given.append((call.name, verdict))
            return verdict

        loop.followup("go")
        await loop.when_idle()
        assert given == [("free", Approve()), ("ask", Ask()), ("pred", Approve())]
        assert default_calls == ["pred"]
        [pending] = loop.decisions
        assert pending.call_id == "c2"

    asyncio.run(main())
