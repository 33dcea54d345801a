"""Insert transforms (``Inbox.on_insert``, ``AgentLoop.on_insert``): every new message passes
them before its splice is planned, so a redacted secret never reaches the log, and a refusal or
an exception leaves the inbox and the log exactly as they were (memory and file stores)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path
from typing import Any, List, Tuple

import pytest

import kerman
from kerman.models import ScriptedModel

SECRET = "sk-live-0123456789"


def redact(message: kerman.UserMessage, target: str) -> kerman.UserMessage:
    if SECRET in message.text:
        return message.with_content(message.text.replace(SECRET, "[redacted]"))
    return message


def no_deploys(message: kerman.UserMessage, target: str) -> Any:
    if "deploy" in message.text:
        return kerman.Refuse("deploys go through the release bot")
    return message


def raw_log_text(log: kerman.SessionLog) -> str:
    return "\n".join(e.to_json() for e in log.events())


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    return kerman.MemoryStore() if request.param == "memory" else kerman.FileStore(tmp_path, durability="strict")


def state(inbox: kerman.Inbox) -> Tuple[Any, ...]:
    return (len(inbox.log), inbox.next_turn, inbox.next_step, [e.to_json() for e in inbox.log.events()])


# -- what a transform may return ---------------------------------------------------------------


def test_a_rewrite_is_what_the_log_records_and_what_the_caller_gets(store: Any) -> None:
    log = store.create("s")
    inbox = kerman.Inbox(log)
    inbox.on_insert(redact)
    stored = inbox.append("next-turn", f"my key is {SECRET}")
    assert stored.text == "my key is [redacted]"
    assert inbox.next_turn == (stored,) and inbox.next_turn[0] is stored
    assert SECRET not in raw_log_text(log)
    inbox.close()
    log.close()
    if isinstance(store, kerman.FileStore):
        assert SECRET not in "".join(p.read_text() for p in Path(store.root).rglob("*") if p.is_file())


def test_splice_and_replace_store_the_rewrites() -> None:
    log = kerman.MemoryStore().create()
    inbox = kerman.Inbox(log)
    inbox.on_insert(redact)
    given = [kerman.UserMessage(f"a {SECRET}", id="a"), kerman.UserMessage("b", id="b")]
    inbox.splice("next-step", 0, 0, given)
    assert [m.text for m in inbox.next_step] == ["a [redacted]", "b"]
    assert inbox.next_step[1] is given[1]
    assert inbox.replace("b", kerman.UserMessage(f"b {SECRET}", id="b2")) is True
    assert [(m.id, m.text) for m in inbox.next_step] == [("a", "a [redacted]"), ("b2", "b [redacted]")]
    assert inbox.get("b2") is inbox.next_step[1]
    assert SECRET not in raw_log_text(log)


def test_the_same_message_back_keeps_the_callers_object() -> None:
    inbox = kerman.Inbox(kerman.MemoryStore().create())
    inbox.on_insert(redact)
    mine = kerman.UserMessage("nothing secret")
    assert inbox.append("next-step", mine) is mine
    assert inbox.next_step[0] is mine


@pytest.mark.parametrize("how", ["refuse", "raise", "wrong type", "async", "other id", "assistant"])
def test_a_refused_insertion_changes_nothing(store: Any, how: str) -> None:
    log = store.create("s")
    inbox = kerman.Inbox(log)
    inbox.append("next-turn", "already queued")

    async def async_transform(message: kerman.UserMessage, target: str) -> kerman.UserMessage:
        return message

    def transform(message: kerman.UserMessage, target: str) -> Any:
        if how == "refuse":
            return kerman.Refuse("no thanks")
        if how == "raise":
            raise RuntimeError("transform bug")
        if how == "wrong type":
            return 42
        if how == "other id":
            return kerman.UserMessage(message.text, id="another-id")
        if how == "assistant":
            return kerman.AssistantMessage("hi", id=message.id)
        raise AssertionError(how)

    inbox.on_insert(async_transform if how == "async" else transform)
    before = state(inbox)
    expected = {
        "refuse": (kerman.InsertRefusedError, r'insert transform .*transform refused message "m1" \(next-turn\): no thanks'),
        "raise": (RuntimeError, "transform bug"),
        "wrong type": (TypeError, r"insert transform .*transform returned 42; expected a UserMessage or kerman.Refuse"),
        "async": (TypeError, r"returned an awaitable; .*must be plain functions"),
        "other id": (ValueError, r'changed the id of message "m1" to "another-id"'),
        "assistant": (TypeError, r'returned a assistant message for "m1"'),
    }[how]
    for insert in (
        lambda: inbox.append("next-turn", kerman.UserMessage("new", id="m1")),
        lambda: inbox.prepend("next-turn", kerman.UserMessage("new", id="m1")),
        lambda: inbox.splice("next-turn", 0, 1, [kerman.UserMessage("new", id="m1")]),
        lambda: inbox.replace(inbox.next_turn[0].id, kerman.UserMessage("new", id="m1")),
    ):
        with pytest.raises(expected[0], match=expected[1]):
            insert()
        assert state(inbox) == before
    inbox.close()
    log.close()
    if isinstance(store, kerman.FileStore):
        reopened = store.open("s")
        assert [e.to_json() for e in reopened.events()] == before[3]
        reopened.close()


def test_the_refusal_error_names_the_transform_reason_message_and_target() -> None:
    inbox = kerman.Inbox(kerman.MemoryStore().create())
    inbox.on_insert(no_deploys)
    with pytest.raises(kerman.InsertRefusedError) as caught:
        inbox.append("next-step", kerman.UserMessage("deploy now", id="d1"))
    err = caught.value
    assert isinstance(err, kerman.InboxError)
    assert (err.transform, err.reason, err.message_id, err.target) == (
        "no_deploys",
        "deploys go through the release bot",
        "d1",
        "next-step",
    )
    assert str(err) == 'insert transform no_deploys refused message "d1" (next-step): deploys go through the release bot'


def test_one_refused_message_refuses_the_whole_splice() -> None:
    inbox = kerman.Inbox(kerman.MemoryStore().create())
    inbox.on_insert(no_deploys)
    inbox.append("next-turn", "a")
    with pytest.raises(kerman.InsertRefusedError):
        inbox.splice("next-turn", 0, 1, ["fine", "deploy it", "also fine"])
    assert [m.text for m in inbox.next_turn] == ["a"]
    assert len(inbox.log) == 1


def test_refuse_needs_a_reason() -> None:
    with pytest.raises(TypeError, match="Refuse needs a reason"):
        kerman.Refuse("")
    assert kerman.Refuse("x") == kerman.Refuse("x") and repr(kerman.Refuse("x")) == "Refuse('x')"


# -- chains and registration -------------------------------------------------------------------


def test_transforms_chain_in_registration_order_and_prepend_goes_first() -> None:
    seen: List[str] = []

    def tag(name: str) -> Any:
        def transform(message: kerman.UserMessage, target: str) -> kerman.UserMessage:
            seen.append(f"{name}:{message.text}:{target}")
            return message.with_content(message.text + name)

        transform.__qualname__ = name
        return transform

    inbox = kerman.Inbox(kerman.MemoryStore().create())
    a, b, c = tag("a"), tag("b"), tag("c")
    assert inbox.on_insert(a) is a
    inbox.on_insert(b)
    inbox.on_insert(c, prepend=True)
    assert inbox.transforms == (c, a, b)
    assert inbox.append("next-step", "x").text == "xcab"
    assert seen == ["c:x:next-step", "a:xc:next-step", "b:xca:next-step"]
    with pytest.raises(ValueError, match="insert transform a is already registered"):
        inbox.on_insert(a)
    with pytest.raises(TypeError, match="must be callable"):
        inbox.on_insert(42)  # type: ignore[call-overload]
    assert inbox.remove_transform(a) and not inbox.remove_transform(a)
    assert inbox.transforms == (c, b)


def test_a_refusal_stops_the_chain() -> None:
    later: List[str] = []
    inbox = kerman.Inbox(kerman.MemoryStore().create())
    inbox.on_insert(no_deploys)
    inbox.on_insert(lambda m, t: later.append(m.text) or m)
    with pytest.raises(kerman.InsertRefusedError):
        inbox.append("next-turn", "deploy")
    assert later == []


def test_listeners_see_the_rewritten_message() -> None:
    inserted: List[kerman.UserMessage] = []
    inbox = kerman.Inbox(kerman.MemoryStore().create(), on_inserted=inserted.append)
    inbox.on_insert(redact)
    stored = inbox.append("next-turn", SECRET)
    assert inserted == [stored] and inserted[0] is stored and stored.text == "[redacted]"


def test_a_closed_inbox_does_not_ask_its_transforms() -> None:
    asked: List[str] = []
    inbox = kerman.Inbox(kerman.MemoryStore().create())
    inbox.on_insert(lambda m, t: asked.append(m.text) or m)
    inbox.close()
    with pytest.raises(kerman.InboxError, match="was closed"):
        inbox.append("next-turn", "late")
    assert asked == []


def test_replace_of_a_message_that_is_not_pending_asks_nothing() -> None:
    asked: List[str] = []
    inbox = kerman.Inbox(kerman.MemoryStore().create())
    inbox.on_insert(lambda m, t: asked.append(t) or m)
    assert inbox.replace("missing", "x") is False
    inbox.append("next-step", kerman.UserMessage("a", id="a"))
    assert inbox.replace("a", "b") is True
    assert asked == ["next-step", "next-step"]


# -- through the loop --------------------------------------------------------------------------


def test_every_delivery_path_of_the_loop_passes_the_transforms() -> None:
    async def main() -> None:
        seen: List[Tuple[str, str]] = []

        def note(message: kerman.UserMessage, target: str) -> kerman.UserMessage:
            seen.append((message.text, target))
            return redact(message, target)

        async def tool(args: dict, ctx: kerman.ToolContext) -> kerman.ToolResult:
            return kerman.ToolResult("ok", additional_contexts=[f"context with {SECRET}"])

        call = {"type": "tool-call", "id": "c1", "name": "lookup", "arguments": "{}"}
        loop = kerman.AgentLoop(ScriptedModel([kerman.ModelReply([call]), "done", "again"]), tools=[kerman.Tool("lookup", tool)])
        assert loop.on_insert(note) is note
        loop.inject(f"injected {SECRET}")
        loop.followup(f"prompt {SECRET}")
        await loop.when_idle()
        loop.steer(f"steer {SECRET}")
        await loop.when_idle()
        assert SECRET not in raw_log_text(loop.log)
        assert seen == [
            (f"injected {SECRET}", "next-step"),
            (f"prompt {SECRET}", "next-turn"),
            (f"context with {SECRET}", "next-step"),
            (f"steer {SECRET}", "next-step"),
        ]
        entered = [kerman.Message.from_dict(e.data).text for e in loop.log.events(types="user/message")]
        assert entered == ["injected [redacted]", "prompt [redacted]", "context with [redacted]", "steer [redacted]"]
        assert loop.remove_listener(note) and loop.inbox.transforms == ()
        await loop.aclose()

    asyncio.run(main())


def test_a_refused_followup_raises_and_starts_no_turn() -> None:
    async def main() -> None:
        loop = kerman.AgentLoop(ScriptedModel(["unused"]))

        @loop.on_insert(prepend=True)
        def guard(message: kerman.UserMessage, target: str) -> Any:
            return no_deploys(message, target)

        with pytest.raises(kerman.InsertRefusedError, match="deploys go through the release bot"):
            loop.followup("deploy to prod")
        assert len(loop.log) == 0 and loop.status == "idle" and loop.turn == 0
        await loop.aclose()

    asyncio.run(main())


def test_a_refused_tool_context_fails_the_turn_after_its_result() -> None:
    async def main() -> None:
        async def tool(args: dict, ctx: kerman.ToolContext) -> kerman.ToolResult:
            return kerman.ToolResult("ok", additional_contexts=["deploy the thing"])

        call = {"type": "tool-call", "id": "c1", "name": "t", "arguments": "{}"}
        loop = kerman.AgentLoop(ScriptedModel([kerman.ModelReply([call]), "done"]), tools=[kerman.Tool("t", tool)])
        loop.on_insert(no_deploys)
        loop.followup("go")
        await loop.when_idle()
        end = loop.log[-1].data
        assert end["reason"]["kind"] == "error"
        assert "deploys go through the release bot" in end["reason"]["error"]["message"]
        assert [e.type for e in loop.log.events(types="tool/result")] == ["tool/result"]
        assert len(loop.inbox) == 0
        await loop.aclose()

    asyncio.run(main())


def test_requeue_and_replay_do_not_run_transforms_again(tmp_path: Path) -> None:
    store = kerman.FileStore(tmp_path)

    async def first() -> None:
        loop = kerman.AgentLoop(ScriptedModel(), log=store.create("s"))
        loop.on_insert(redact)

        @loop.pre_step
        async def block(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
            return kerman.Reject("later")

        loop.followup(f"key {SECRET}")
        loop.inject(f"note {SECRET}")  # pending: replayed on reopen
        await loop.when_idle()
        await loop.aclose()
        loop.log.close()

    async def second() -> None:
        asked: List[str] = []
        loop = kerman.AgentLoop(ScriptedModel(["ok"]), log=store.open("s"))
        loop.on_insert(lambda m, t: asked.append(m.text) or m)
        assert [m.text for m in loop.inbox.next_step] == ["note [redacted]"]
        requeued = loop.requeue_claimed(1)
        assert [m.text for m in requeued] == ["key [redacted]"]
        assert asked == []
        await loop.aclose()
        loop.log.close()

    asyncio.run(first())
    asyncio.run(second())


def test_a_loop_whose_transform_refers_to_it_is_collected() -> None:
    async def main() -> weakref.ref:
        loop = kerman.AgentLoop(ScriptedModel())

        def transform(message: kerman.UserMessage, target: str) -> kerman.UserMessage:
            assert loop.status in ("idle", "running")
            return message

        loop.on_insert(transform)
        loop.inject("x")
        return weakref.ref(loop)

    ref = asyncio.run(main())
    gc.collect()
    assert ref() is None
