"""The approvals gate, tested with kerman.testing: the gate alone over calls (its verdicts),
then installed on a loop with a scripted model: a turn that waits for a person, decided."""

from __future__ import annotations

import asyncio

from kerman_example_plugins import approvals

import kerman
from kerman import testing


def calls(*items: tuple[str, str, str]) -> kerman.ModelReply:
    return kerman.ModelReply([{"type": "tool-call", "id": i, "name": n, "arguments": a} for i, n, a in items])


def test_a_large_transfer_asks_with_a_note() -> None:
    verdict = testing.gate_verdict(approvals.payments_gate, "transfer", {"amount": 900})
    assert verdict == kerman.Ask(note="a transfer above 500 needs a person")


def test_deletes_are_denied_and_refunds_clamped() -> None:
    assert testing.gate_verdict(approvals.payments_gate, "delete_account", {}) == kerman.Deny("deleting needs a ticket, not a chat")
    assert testing.gate_verdict(approvals.payments_gate, "refund", '{"amount": 800, "to": "ann"}') == kerman.Edit(
        {"amount": 500, "to": "ann"}
    )


def test_small_calls_go_on_down_the_waterfall() -> None:
    call = testing.make_tool_call("transfer", {"amount": 20})
    next = testing.FakeNext.approving()
    assert asyncio.run(approvals.payments_gate(call, next)) == kerman.Approve()
    assert next.calls == 1


async def transfer(amount: int) -> str:
    """Moves money."""
    return f"moved {amount}"


def test_a_turn_waits_for_the_person_and_runs_what_they_decided() -> None:
    async def main() -> None:
        loop = testing.scripted_loop([calls(("c1", "transfer", '{"amount": 900}')), "Done."], plugins=[approvals.install])
        loop.tool(transfer)
        result = await testing.run_turn(loop, "pay the invoice")
        [request] = result.assert_waiting("transfer")
        assert request.note == "a transfer above 500 needs a person"
        assert result.ran == []  # nothing runs while it waits

        after = await result.decide(kerman.Edit({"amount": 450}), by="ann")
        assert after.outcomes == ["edited"]
        assert after.ran == [("transfer", {"amount": 450})]
        after.assert_completed()
        await loop.aclose()

    asyncio.run(main())


def test_a_denied_transfer_never_runs() -> None:
    async def main() -> None:
        loop = testing.scripted_loop([calls(("c1", "transfer", '{"amount": 900}')), "Understood."], plugins=[approvals.install])
        loop.tool(transfer)
        result = await testing.run_turn(loop, "pay the invoice")
        after = await result.decide(kerman.Deny("not this month"))
        assert after.outcomes == ["denied"] and after.ran == []
        after.assert_completed()
        await loop.aclose()

    asyncio.run(main())
