"""``kerman.testing`` for ``before_tool`` gates: a gate run over one call without a model (its
verdict read as the loop reads it), and scripted turns that wait for a person and are decided."""

from __future__ import annotations

import asyncio
from typing import Any, List

import pytest

import kerman
from kerman import testing


def calls(*items: tuple) -> kerman.ModelReply:
    return kerman.ModelReply([{"type": "tool-call", "id": i, "name": n, "arguments": a} for i, n, a in items])


async def no_deletes(call: kerman.ToolCall, next: Any) -> Any:
    if call.name.startswith("delete"):
        return kerman.Deny(f"no {call.name}")
    return await next()


async def ask_big(call: kerman.ToolCall, next: Any) -> Any:
    if (call.arguments or {}).get("amount", 0) > 100:
        return kerman.Ask(note="big")
    return await next()


def test_make_tool_call_parses_arguments_as_the_loop_does() -> None:
    call = testing.make_tool_call("pay", '{"amount": 3}', call_id="c9", turn=2, step=3)
    assert (call.name, call.arguments, call.call_id, call.turn, call.step) == ("pay", {"amount": 3}, "c9", 2, 3)
    assert isinstance(call.loop, kerman.AgentLoop) and not call.signal.aborted
    assert testing.make_tool_call("pay", "{not json").arguments is None
    assert testing.make_tool_call("pay").arguments == {}


def test_a_gate_verdict_and_the_default_at_the_end_of_the_waterfall() -> None:
    assert testing.gate_verdict(no_deletes, "delete_user", {"id": 1}) == kerman.Deny("no delete_user")
    assert testing.gate_verdict(no_deletes, "search", {"q": "x"}) == kerman.Approve()
    # In order: the first gate's verdict wins; one that calls next() hands on.
    assert testing.gate_verdict([ask_big, no_deletes], "delete_all", {"amount": 500}) == kerman.Ask(note="big")
    assert testing.gate_verdict([no_deletes, ask_big], "delete_all", {"amount": 500}) == kerman.Deny("no delete_all")


def test_an_agent_loops_gates_and_its_tools_needs_approval() -> None:
    loop = kerman.AgentLoop(kerman.models.ScriptedModel([]))

    @loop.tool(needs_approval=lambda call: call.arguments["amount"] > 10)
    async def pay(amount: int) -> str:
        """Pays."""
        return "paid"

    assert testing.gate_verdict(loop, "pay", {"amount": 5}) == kerman.Approve()
    assert testing.gate_verdict(loop, "pay", {"amount": 50}) == kerman.Ask()  # the default: needs approval
    loop.before_tool(no_deletes)
    assert testing.gate_verdict(loop, "delete_pay", {}) == kerman.Deny("no delete_pay")
    call = testing.make_tool_call("pay", {"amount": 50})  # a loop without the tool: nothing needs approval
    assert asyncio.run(testing.run_gate(loop, call)) == kerman.Approve()


def test_what_the_loop_would_refuse_raises() -> None:
    async def sloppy(call: kerman.ToolCall, next: Any) -> Any:
        return "yes"

    async def bad_edit(call: kerman.ToolCall, next: Any) -> Any:
        return kerman.Edit([1, 2])  # type: ignore[arg-type]

    async def broken(call: kerman.ToolCall, next: Any) -> Any:
        raise RuntimeError("boom")

    with pytest.raises(TypeError, match="returned 'yes'; expected Approve, Deny, Edit or Ask"):
        testing.gate_verdict(sloppy, "x")
    with pytest.raises(TypeError, match="edited arguments must be a JSON object"):
        testing.gate_verdict(bad_edit, "x")
    with pytest.raises(RuntimeError, match="boom"):
        testing.gate_verdict(broken, "x")
    with pytest.raises(TypeError, match="not with a ToolCall"):
        testing.gate_verdict(broken, testing.make_tool_call("x"), {"a": 1})


def test_fake_next_approving() -> None:
    next = testing.FakeNext.approving()
    assert asyncio.run(ask_big(testing.make_tool_call("pay", {"amount": 1}), next)) == kerman.Approve()
    assert next.calls == 1


def test_a_scripted_turn_waits_and_is_decided_in_order() -> None:
    async def main() -> List[Any]:
        ran: List[int] = []
        loop = testing.scripted_loop(
            [calls(("c1", "pay", '{"amount": 500}'), ("c2", "pay", '{"amount": 200}')), "Done."],
            plugins=[lambda lp: lp.before_tool(ask_big)],
        )

        @loop.tool
        async def pay(amount: int) -> str:
            """Pays."""
            ran.append(amount)
            return "paid"

        result = await testing.run_turn(loop, "pay both")
        assert result.waiting and [p.call_id for p in result.assert_waiting("pay", "pay")] == ["c1", "c2"]
        with pytest.raises(AssertionError, match="expected \\['transfer'\\]"):
            result.assert_waiting("transfer")
        with pytest.raises(TypeError, match="takes one outcome each, got 1"):
            await result.decide(kerman.Approve())
        after = await result.decide(kerman.Deny("too much"), kerman.Edit({"amount": 150}), by="ann")
        assert after.outcomes == ["denied", "edited"]
        assert after.ran == [("pay", {"amount": 150})] and ran == [150]
        assert not after.waiting
        after.assert_completed()
        assert len(after.requests) == 1  # the model was asked once more, after the results
        with pytest.raises(AssertionError, match="nothing waits for a decision"):
            await after.decide(kerman.Approve())
        resolved = [e.data for e in loop.log.events() if e.type == "decision/resolved"]
        await loop.aclose()
        return resolved

    resolved = asyncio.run(main())
    assert [(r["callId"], r["outcome"], r.get("by")) for r in resolved] == [("c1", "denied", "ann"), ("c2", "edited", "ann")]


def test_a_question_is_answered() -> None:
    async def main() -> None:
        async def question(call: kerman.ToolCall, next: Any) -> Any:
            return kerman.Ask(note="which?", schema={"type": "integer"})

        loop = testing.scripted_loop([calls(("c1", "pick", "{}")), "Ok."], plugins=[lambda lp: lp.before_tool(question)])

        @loop.tool
        async def pick() -> str:
            """Picks."""
            raise AssertionError("an answered call does not run")

        result = await testing.run_turn(loop, "pick one")
        [request] = result.assert_waiting("pick")
        assert request.kind == "answer" and request.schema == {"type": "integer"}
        after = await result.decide(kerman.Answer(2))
        assert after.outcomes == ["answered"] and after.ran == []
        after.assert_completed()
        [result_event] = after.of_type("tool/result")
        assert result_event.data["message"]["content"][0]["content"] == [{"type": "text", "text": "2"}]
        await loop.aclose()

    asyncio.run(main())
