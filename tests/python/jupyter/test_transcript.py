"""``log.transcript()`` (issue 15 part 2): the conversation as the log records it — the messages
of ``user/message``, ``assistant/message`` and ``tool/result`` in log order — as a sequence value
with each turn's ending, and a chat-like HTML view. What it shows of rejected batches, steering
and interrupted replies is pinned here (docs/notebooks.md, "The transcript")."""

from __future__ import annotations

import asyncio
from typing import Any, List

import pytest

import kerman
from kerman import AgentLoop, MemoryStore, ModelReply, Reject, Transcript, UserMessage
from kerman.models import ScriptedModel


def call(name: str, args: str = "{}", id: str = "c1") -> dict:
    return {"type": "tool-call", "id": id, "name": name, "arguments": args}


def run(loop: AgentLoop, *prompts: str) -> None:
    async def main() -> None:
        for prompt in prompts:
            loop.followup(prompt)
            await loop.when_idle()
            if loop.inbox.has_pending:  # a blocked turn leaves the loop idle with input pending
                loop.wake()
                await loop.when_idle()

    asyncio.run(main())


def test_the_conversation_in_log_order_with_tool_results_as_a_sequence():
    model = ScriptedModel(
        [ModelReply([{"type": "text", "text": "Let me add."}, call("add", '{"a": 19, "b": 23}')]), "The sum is 42.", "Bye."]
    )
    loop = AgentLoop(model)

    @loop.tool
    async def add(a: int, b: int) -> str:
        return str(a + b)

    run(loop, "What is 19 + 23?", "Thanks")
    t = loop.log.transcript()
    assert isinstance(t, Transcript) and t.session_id == loop.log.id and t.stop == len(loop.log)
    assert [(m.role, m.text) for m in t] == [
        ("user", "What is 19 + 23?"),
        ("assistant", "Let me add."),
        ("user", "42"),
        ("assistant", "The sum is 42."),
        ("user", "Thanks"),
        ("assistant", "Bye."),
    ]
    assert type(t[2]).__name__ == "ToolResultMessage" and t[2].call_id == "c1"
    assert len(t) == 6 and t[-1] == t[5] and t[1:3] == [t[1], t[2]] and t[::-2] == [t[5], t[3], t[1]]
    with pytest.raises(IndexError, match="transcript index 6 out of range for 6 messages"):
        t[6]
    with pytest.raises(TypeError, match="transcript indices must be integers or slices, not str"):
        t["0"]  # type: ignore[call-overload]
    # where each sits: the event, its turn and step
    by_seq = {e.seq: e for e in loop.log}
    for entry in t.entries():
        assert entry["message"] in t
        assert by_seq[entry["seq"]].type in ("user/message", "assistant/message", "tool/result")
    assert [(e["turn"], e["step"]) for e in t.entries()] == [(1, 1), (1, 1), (1, 1), (1, 2), (2, 1), (2, 1)]
    assert [(e["turn"], e["reason"]) for e in t.endings] == [(1, {"kind": "completed"}), (2, {"kind": "completed"})]
    # the same messages the model was sent: the derived history
    assert model.requests[-1].messages == list(t)[:-1]
    assert repr(t) == f"<Transcript session={loop.log.id!r} messages=6 turns=2>"


def test_it_is_a_snapshot_and_an_empty_log_has_an_empty_transcript():
    log = MemoryStore().create("s")
    empty = log.transcript()
    assert len(empty) == 0 and list(empty) == [] and empty.endings == []
    assert "no messages yet" in empty._repr_html_()
    loop = AgentLoop(ScriptedModel(["ok"]), log=log)
    run(loop, "hello")
    assert len(empty) == 0 and len(log.transcript()) == 2


def test_steering_is_marked_as_entered_mid_turn():
    loop = AgentLoop(ScriptedModel([ModelReply([call("look")]), "went left"]))

    @loop.tool
    async def look() -> str:
        loop.steer("go left instead")
        return "a fork in the road"

    run(loop, "walk")
    entries = loop.log.transcript().entries()
    assert [(e["message"].text, e["step"], e["mid_turn"]) for e in entries] == [
        ("walk", 1, False),
        ("", 1, False),
        ("a fork in the road", 1, False),
        ("go left instead", 2, True),
        ("went left", 2, False),
    ]
    html = loop.log.transcript()._repr_html_()
    assert "entered at step 2 (steering)" in html


def test_a_rejected_batch_is_no_message_but_its_turn_ends_blocked():
    loop = AgentLoop(ScriptedModel(["fine", "also fine"]))

    @loop.pre_step
    async def guard(step: kerman.PreStep, next: Any) -> Any:
        if any("rm -rf" in m.text for m in step.messages):
            return Reject("needs a human")
        return await next()

    run(loop, "list files", "rm -rf /", "show disk usage")
    t = loop.log.transcript()
    assert [m.text for m in t] == ["list files", "fine", "show disk usage", "also fine"]
    assert [e["reason"]["kind"] for e in t.endings] == ["completed", "blocked", "completed"]
    assert t.endings[1]["reason"] == {"kind": "blocked", "reason": "needs a human"}
    html = t._repr_html_()
    assert "turn 2 ended: blocked (needs a human)" in html and "rm -rf" not in html
    assert "ended: completed" not in html  # ordinary endings are not lines of the chat


def test_an_interrupted_reply_is_kept_and_marked():
    async def main() -> AgentLoop:
        streaming = asyncio.Event()

        async def model(request: kerman.ModelRequest) -> Any:
            yield {"type": "text-delta", "text": "Once upon"}
            streaming.set()
            await asyncio.get_running_loop().create_future()  # until cancelled

        loop = AgentLoop(model)
        loop.followup("tell a story")
        await streaming.wait()
        loop.cancel()
        await loop.when_idle()
        return loop

    loop = asyncio.run(main())
    t = loop.log.transcript()
    assert [(m.role, m.text) for m in t] == [("user", "tell a story"), ("assistant", "Once upon")]
    assert [e["interrupted"] for e in t.entries()] == [False, True]
    assert t.endings[0]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
    html = t._repr_html_()
    assert "interrupted" in html and "turn 1 ended: aborted (user)" in html


def test_a_rolled_back_turn_stays_in_the_transcript_marked_rolled_back():
    async def main() -> AgentLoop:
        streaming = asyncio.Event()

        async def model(request: kerman.ModelRequest) -> Any:
            yield {"type": "text-delta", "text": "Once upon"}
            if request.messages[-1].text == "tell a story":
                streaming.set()
                await asyncio.get_running_loop().create_future()  # until cancelled
            yield {"type": "finish", "reason": "stop"}

        loop = AgentLoop(model)
        loop.followup("tell a story")
        await streaming.wait()
        loop.followup("a poem instead", on_busy="rollback")
        await loop.when_idle()
        return loop

    loop = asyncio.run(main())
    t = loop.log.transcript()
    assert [m.text for m in t] == ["tell a story", "Once upon", "a poem instead", "Once upon"]
    assert t.endings[0]["reason"] == {"kind": "aborted", "reason": {"kind": "rollback"}}
    html = t._repr_html_()
    assert html.count("rolled back") == 3  # its two messages, and its ending
    assert "turn 1 ended: aborted (rollback); rolled back" in html


def test_a_long_conversation_shows_its_last_messages():
    loop = AgentLoop(ScriptedModel([f"reply {i}" for i in range(100)]))
    run(loop, *[f"prompt {i}" for i in range(100)])
    t = loop.log.transcript()
    assert len(t) == 200
    html = t._repr_html_()
    assert "the last 50 of 200 messages" in html
    assert "reply 99" in html and "prompt 75" in html and "prompt 74<" not in html and "reply 74<" not in html


def test_the_chat_html_orders_messages_and_escapes_them():
    loop = AgentLoop(ScriptedModel(["<script>alert(1)</script>"]))
    run(loop, "<b>bold?</b>")
    html = loop.transcript()._repr_html_()
    assert "<script>" not in html and "<b>bold?</b>" not in html
    assert html.index("&lt;b&gt;bold?") < html.index("&lt;script&gt;")
    assert 'class="k-msg k-user"' in html and 'class="k-msg k-assistant"' in html


def test_a_reopened_session_keeps_its_transcript(tmp_path):
    store = kerman.FileStore(tmp_path, durability="none")
    log = store.create("s")
    loop = AgentLoop(ScriptedModel(["one"]), log=log)
    run(loop, "first")
    before: List[UserMessage] = list(log.transcript())
    log.close()
    with store.open("s") as again:
        assert list(again.transcript()) == before
