"""The guard plugin, tested with kerman.testing: the listener alone, the transform alone, then
both installed on a loop with a scripted model."""

from __future__ import annotations

import asyncio

import pytest
from kerman_example_plugins import guard

import kerman
from kerman import testing
from kerman.models import ScriptedModel

KEY = "sk-live_abcdefghijklmnop"


@pytest.mark.parametrize("text", ["rm -rf /var/lib/build", "please DROP TABLE users", "git push origin main --force"])
def test_destructive_batches_are_rejected_with_the_reason(text: str) -> None:
    decision = testing.decide(guard.block_destructive, ["list the files", text])
    assert isinstance(decision, kerman.Reject)
    assert decision.reason is not None and decision.reason.endswith(f"needs a human: {text!r}")


def test_other_batches_go_on_down_the_waterfall() -> None:
    step = testing.make_pre_step(["list the files"])
    next = testing.FakeNext.entering(step)
    decision = asyncio.run(guard.block_destructive(step, next))
    assert next.calls == 1
    assert isinstance(decision, kerman.Enter) and [m.text for m in decision.messages] == ["list the files"]


def test_a_rejection_skips_the_listeners_after_it() -> None:
    later: list[str] = []

    async def after(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
        later.append("ran")
        return await next()

    assert isinstance(testing.decide([guard.block_destructive, after], ["rm -rf /"]), kerman.Reject)
    assert later == []


def test_keys_are_redacted_before_they_are_stored() -> None:
    stored = testing.run_insert(guard.redact_keys, f"deploy with {KEY} please")
    assert stored.text == "deploy with [redacted key] please"
    plain = kerman.UserMessage("no key here")
    assert testing.run_insert(guard.redact_keys, plain) is plain


def test_a_key_in_plugin_context_is_refused() -> None:
    note = kerman.UserMessage(f"env has {KEY}", source={"kind": "plugin", "plugin": "env"})
    with pytest.raises(kerman.InsertRefusedError, match="context must not carry an API key") as caught:
        testing.run_insert(guard.redact_keys, note, target="next-step")
    assert caught.value.transform == "redact_keys" and caught.value.message_id == note.id


def test_installed_on_a_loop_the_log_never_holds_the_key(kerman_loop: kerman.AgentLoop, kerman_model: ScriptedModel) -> None:
    guard.install(kerman_loop)

    async def main() -> None:
        first = await testing.run_turn(kerman_loop, f"my key is {KEY}; list the files", replies=["done"])
        first.assert_completed()
        first.assert_entered("my key is [redacted key]; list the files")
        blocked = await testing.run_turn(kerman_loop, "now rm -rf /")
        blocked.assert_blocked("recursive forced delete (rm -rf) needs a human: 'now rm -rf /'")
        assert blocked.requests == []

    asyncio.run(main())
    assert all(KEY not in event.to_json() for event in kerman_loop.log.events())
    assert len(kerman_model.requests) == 1
