"""The ``before_tool`` gate and decisions within one process (docs/decisions.md): every verdict,
the ``needs_approval`` shorthand, several requests per step decided in any order, idempotent
keys, refusals, expiry and cancel while waiting."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any, Dict, List

import pytest

import kerman
from kerman import AgentLoop, Answer, Approve, Ask, DecisionError, Deny, Edit, ModelReply, ToolCall
from kerman.models import ScriptedModel


def calls(*items: Any) -> ModelReply:
    """A reply of tool calls ``(id, name, arguments dict)``."""
    return ModelReply([{"type": "tool-call", "id": i, "name": n, "arguments": json.dumps(a)} for i, n, a in items])


class Counting:
    """Tools that record each run's arguments."""

    def __init__(self) -> None:
        self.ran: List[Dict[str, Any]] = []

    def tool(self, name: str, **kw: Any) -> kerman.Tool:
        async def body(args: Dict[str, Any], ctx: kerman.ToolContext) -> str:
            self.ran.append({"tool": name, **args})
            return f"{name} ok"

        return kerman.Tool(name, body, **kw)


def results(loop: AgentLoop) -> List[Dict[str, Any]]:
    out = []
    for e in loop.log.events():
        if e.type == "tool/result":
            block = e.data["message"]["content"][0]
            out.append({"text": block["content"][0]["text"], "code": (e.data.get("error") or {}).get("code")})
    return out


def of_type(loop: AgentLoop, kind: str) -> List[Dict[str, Any]]:
    return [e.data for e in loop.log.events() if e.type == kind]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_gate_that_awaits_next_runs_the_call_with_no_decision_logged() -> None:
    async def main() -> None:
        t = Counting()
        loop = AgentLoop(ScriptedModel([calls(("c1", "t", {"a": 1})), "done"]), tools=[t.tool("t")])
        seen: List[ToolCall] = []

        @loop.before_tool
        async def gate(call: ToolCall, next: Any) -> Any:
            seen.append(call)
            return await next()

        loop.followup("go")
        await loop.when_idle()
        assert t.ran == [{"tool": "t", "a": 1}]
        assert [(c.call_id, c.name, c.arguments, c.turn, c.step) for c in seen] == [("c1", "t", {"a": 1}, 1, 1)]
        assert not [e for e in loop.log.events() if e.type.startswith("decision/")]
        assert loop.status == "idle"

    run(main())


def test_deny_edit_raise_and_a_bad_return_never_run_what_they_stop() -> None:
    async def main() -> None:
        t = Counting()
        model = ScriptedModel([calls(("c1", "t", {"n": 1}), ("c2", "t", {"n": 2}), ("c3", "t", {"n": 3}), ("c4", "t", {"n": 4})), "done"])
        loop = AgentLoop(model, tools=[t.tool("t")])

        @loop.before_tool
        async def gate(call: ToolCall, next: Any) -> Any:
            n = call.arguments["n"]
            if n == 1:
                return Deny("too risky")
            if n == 2:
                return Edit({"n": 20})
            if n == 3:
                raise RuntimeError("gate broke")
            return "yes"  # not a verdict

        loop.followup("go")
        await loop.when_idle()
        assert t.ran == [{"tool": "t", "n": 20}]
        r = results(loop)
        assert r[0] == {"text": "tool call 't' was denied: too risky", "code": "TOOL_DENIED"}
        assert r[1] == {"text": "t ok", "code": None}
        assert r[2]["code"] == "GATE_ERROR" and "gate broke" in r[2]["text"]
        assert r[3]["code"] == "GATE_ERROR" and "'yes'" in r[3]["text"]
        assert of_type(loop, "tool/call")[1]["arguments"] == '{"n":20}'
        # The turn goes on: the model was told and answered.
        assert of_type(loop, "turn/end")[0]["reason"]["kind"] == "completed"

    run(main())


def test_ask_waits_lists_the_request_and_approve_runs_the_exact_call_once() -> None:
    """Issue 27 item 2: ``read`` needs no decision and runs while ``pay`` waits (its result is
    committed at once; test_run_while_waiting.py has the rest of the rule)."""

    async def main() -> None:
        t = Counting()
        requests = []

        async def model(request: kerman.ModelRequest) -> Any:
            requests.append(request)
            return calls(("c1", "read", {}), ("c2", "pay", {"amount": 5})) if len(requests) == 1 else ModelReply("paid")

        loop = AgentLoop(model, tools=[t.tool("read"), t.tool("pay", needs_approval=True)])
        statuses: List[str] = []
        loop.on("agent/status", lambda e: statuses.append(e.status))
        loop.followup("pay bob")
        await loop.when_idle()  # returns: the turn waits for a person
        assert loop.status == "waiting"
        assert statuses == ["running", "waiting"]
        assert t.ran == [{"tool": "read"}]  # the call that needs no decision ran
        [pending] = loop.decisions
        assert (pending.call_id, pending.name, pending.arguments, pending.kind) == ("c2", "pay", '{"amount": 5}', "approval")
        assert pending.digest.startswith("sha256:")
        assert "PendingDecision" in repr(pending)
        assert loop.decide(pending.decision_id, Approve(), by="ann", key="k1") is True
        await loop.when_idle()
        assert t.ran == [{"tool": "read"}, {"tool": "pay", "amount": 5}]
        assert len(requests) == 2  # the model was not asked again for the decided call
        [resolved] = of_type(loop, "decision/resolved")
        assert resolved["outcome"] == "approved" and resolved["by"] == "ann" and resolved["digest"] == pending.digest
        assert loop.status == "idle" and loop.decisions == []
        # The same key again: applied once, nothing appended; another key: refused.
        assert loop.decide(pending.decision_id, Approve(), key="k1") is False
        with pytest.raises(DecisionError) as e:
            loop.decide(pending.decision_id, Deny(), key="k2")
        assert e.value.reason == "resolved"
        assert len(of_type(loop, "decision/resolved")) == 1
        assert len(t.ran) == 2

    run(main())


def test_needs_approval_predicate_and_decorator_form() -> None:
    async def main() -> None:
        ran = []
        loop = AgentLoop(ScriptedModel([calls(("c1", "pay", {"amount": 5}), ("c2", "pay", {"amount": 500})), "done"]))

        @loop.tool(needs_approval=lambda call: call.arguments["amount"] > 100)
        async def pay(amount: int) -> str:
            """Pays."""
            ran.append(amount)
            return "paid"

        loop.followup("go")
        await loop.when_idle()
        [pending] = loop.decisions
        assert pending.call_id == "c2"
        loop.decide(pending.decision_id, Deny("over the limit"))
        await loop.when_idle()
        assert ran == [5]
        assert results(loop)[1] == {"text": "tool call 'pay' was denied: over the limit", "code": "TOOL_DENIED"}

    run(main())


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 0, 2)])
def test_several_requests_in_one_step_decided_in_any_order(order: Any) -> None:
    async def main() -> None:
        t = Counting()
        model = ScriptedModel([calls(("c1", "a", {}), ("c2", "b", {"x": 1}), ("c3", "c", {})), "done"])
        loop = AgentLoop(model, tools=[t.tool("a"), t.tool("b"), t.tool("c", needs_approval=True)])

        @loop.before_tool
        async def gate(call: ToolCall, next: Any) -> Any:
            if call.name == "c":
                return await next()
            return Ask(note=f"run {call.name}?")

        loop.followup("go")
        await loop.when_idle()
        pending = loop.decisions
        assert [p.call_id for p in pending] == ["c1", "c2", "c3"]
        assert pending[0].note == "run a?"
        outcomes = [Deny("no"), Edit({"x": 2}), Approve()]
        for n, i in enumerate(order):
            loop.decide(pending[i].decision_id, outcomes[i])
            if n < 2:
                assert loop.status == "waiting"
        await loop.when_idle()
        assert t.ran == [{"tool": "b", "x": 2}, {"tool": "c"}]
        assert [r["code"] for r in results(loop)] == ["TOOL_DENIED", None, None]

    run(main())


def test_answer_is_the_calls_result_and_refusals_name_why() -> None:
    async def main() -> None:
        t = Counting()
        loop = AgentLoop(ScriptedModel([calls(("c1", "ask_user", {"q": "color?"})), "done"]), tools=[t.tool("ask_user")])

        @loop.before_tool
        async def gate(call: ToolCall, next: Any) -> Any:
            return Ask(note=call.arguments["q"], schema={"type": "string"})

        loop.followup("go")
        await loop.when_idle()
        [pending] = loop.decisions
        assert pending.kind == "answer" and pending.schema == {"type": "string"}
        with pytest.raises(DecisionError) as e:
            loop.decide("no-such-id", Approve())
        assert e.value.reason == "unknown"
        with pytest.raises(DecisionError) as e:
            loop.decide(pending.decision_id, Approve())
        assert e.value.reason == "invalid"
        with pytest.raises(TypeError):
            loop.decide(pending.decision_id, "yes")
        loop.decide(pending.decision_id, Answer("blue"))
        await loop.when_idle()
        assert t.ran == []
        assert results(loop) == [{"text": "blue", "code": None}]

    run(main())


def test_an_expired_request_is_refused_and_the_timer_resolves_the_rest() -> None:
    async def main() -> None:
        t = Counting()
        loop = AgentLoop(ScriptedModel([calls(("c1", "t", {}), ("c2", "t", {"late": True})), "done"]), tools=[t.tool("t")])

        @loop.before_tool
        async def gate(call: ToolCall, next: Any) -> Any:
            if call.arguments.get("late"):
                return Ask(expires_in=0.05)
            return Ask(expires_at=time.time() - 1)  # already past

        done = asyncio.get_running_loop().create_future()
        loop.on("agent/status", lambda ev: ev.status == "idle" and not done.done() and done.set_result(None))
        loop.followup("go")
        await loop.when_idle()
        # The timer resolves each request as its deadline passes; then the turn goes on.
        await asyncio.wait_for(done, 5)
        [first, second] = of_type(loop, "decision/requested")
        with pytest.raises(DecisionError) as e:
            loop.decide(first["decisionId"], Approve())
        assert e.value.reason == "expired"
        assert t.ran == []
        assert [d["outcome"] for d in of_type(loop, "decision/resolved")] == ["expired", "expired"]
        assert [r["code"] for r in results(loop)] == ["TOOL_DENIED", "TOOL_DENIED"]

    run(main())


@pytest.mark.parametrize("keep_inbox", [False, True])
def test_cancel_while_waiting_resolves_cancelled_and_ends_the_turn(keep_inbox: bool) -> None:
    async def main() -> None:
        t = Counting()
        loop = AgentLoop(ScriptedModel([calls(("c1", "t", {})), "later"]), tools=[t.tool("t", needs_approval=True)])
        loop.followup("go")
        await loop.when_idle()
        loop.followup("queued meanwhile")  # waits with the turn
        assert loop.status == "waiting"
        loop.cancel(keep_inbox=keep_inbox)
        await loop.when_idle()
        assert t.ran == []
        assert of_type(loop, "decision/resolved")[0]["outcome"] == "cancelled"
        assert of_type(loop, "turn/end")[0]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
        assert results(loop)[0]["code"] == "ABORTED_BEFORE_DISPATCH"
        assert loop.inbox.has_pending is keep_inbox
        assert loop.decisions == []

    run(main())


def test_verdict_types_are_frozen_values_with_reprs() -> None:
    assert repr(Deny("x")) == "Deny(reason='x')"
    assert repr(Edit({"a": 1})) == "Edit(arguments={'a': 1})"
    assert Approve() == Approve()
    with pytest.raises(dataclasses.FrozenInstanceError):
        Deny("x").reason = "y"  # type: ignore[misc]
    with pytest.raises(ValueError):
        Ask(expires_in=1, expires_at=2)
    assert Ask(expires_at=10).deadline_ms == 10000
