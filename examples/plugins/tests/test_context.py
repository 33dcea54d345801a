"""The context plugin, tested with kerman.testing."""

from __future__ import annotations

import asyncio

from kerman_example_plugins import context, guard

import kerman
from kerman import testing


def note(path: str) -> kerman.UserMessage:
    return kerman.UserMessage(f"{path} changed", source=context.NOTE)


def test_notes_fold_into_one_message_after_the_prompt() -> None:
    a, b = note("src/loop.py"), note("README.md")
    decision = testing.decide(context.fold_notes, [a, b, "Review my changes"])
    assert isinstance(decision, kerman.Enter)
    prompt, folded = decision.messages
    assert prompt.text == "Review my changes"
    assert folded.text == "Workspace changes since your last message:\n- src/loop.py changed\n- README.md changed"
    assert folded.source == {"kind": "plugin", "plugin": "context", "folded": [a.id, b.id]}


def test_a_batch_without_notes_enters_unchanged_and_a_rejection_stands() -> None:
    prompt = kerman.UserMessage("hello")
    decision = testing.decide(context.fold_notes, [prompt])
    assert isinstance(decision, kerman.Enter) and decision.messages == [prompt]
    assert isinstance(testing.decide([context.fold_notes, guard.block_destructive], [note("x"), "rm -rf /"]), kerman.Reject)


def test_a_whole_turn_with_both_plugins(kerman_loop: kerman.AgentLoop) -> None:
    guard.install(kerman_loop)
    context.install(kerman_loop)

    async def main() -> testing.TurnResult:
        context.file_changed(kerman_loop, "src/loop.py")
        assert kerman_loop.status == "idle"  # inject does not wake
        return await testing.run_turn(kerman_loop, "Review my changes", replies=["Looks good."])

    result = asyncio.run(main())
    result.assert_completed()
    result.assert_entered("Review my changes", "Workspace changes since your last message:\n- src/loop.py changed")
    assert [m.text for m in result.requests[0].entered] == [m.text for m in result.entered]
    assert [m.text for m in result.replies] == ["Looks good."]
