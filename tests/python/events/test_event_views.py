"""kerman.events: every event type Kerman writes has a typed view, and each view reads the
payload the loop, the inbox and a repair actually wrote (a streamed turn with tool calls, a
tool that raises, an unknown tool, a model failure, a rejection, a cancel mid-stream, a repair);
unknown fields and plugin types stay as they were stored."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

import kerman
from conftest import event_record, header_record, session_path, write_raw_session
from kerman import events


async def _record_session() -> tuple[list[kerman.Event], kerman.SessionLog]:
    """One session exercising every type the loop and the inbox write."""
    streaming = asyncio.Event()
    replies: list[Any] = [
        # turn 1: streamed reasoning, text and a tool call, usage
        [
            {"type": "reasoning-delta", "text": "look it up"},
            {"type": "text-delta", "text": "Let me "},
            {"type": "text-delta", "text": "look."},
            {"type": "tool-call", "id": "c1", "name": "lookup", "arguments": '{"q": "k"}'},
            {"type": "usage", "input": 5, "output": 3, "vendorCount": 7},
            {"type": "finish", "reason": "stop"},
        ],
        # turn 1, step 2: two calls, one raising, one to an unknown tool
        [
            {"type": "tool-call", "id": "c2", "name": "broken", "arguments": "{}"},
            {"type": "tool-call", "id": "c3", "name": "missing", "arguments": "{}"},
            {"type": "finish", "reason": "stop"},
        ],
        [{"type": "text-delta", "text": "Done."}, {"type": "finish", "reason": "stop"}],
        # turn 2: a model failure
        kerman.ModelError("rate limited", code="RATE_LIMITED", status=429),
        # turn 4 (turn 3 is rejected): cancelled mid-stream
        "wait",
    ]

    async def model(request: kerman.ModelRequest) -> AsyncIterator[dict[str, Any]]:
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        if reply == "wait":
            yield {"type": "text-delta", "text": "Working"}
            streaming.set()
            await asyncio.Event().wait()
        for chunk in reply:
            yield chunk

    log = kerman.MemoryStore().create("events")
    loop = kerman.AgentLoop(model, log=log, instructions="Be brief.")

    @loop.tool
    async def lookup(q: str) -> str:
        """Looks something up."""
        return f"{q}: found"

    @loop.tool
    async def broken() -> str:
        """Always fails."""
        raise RuntimeError("the disk is on fire")

    @loop.pre_step
    async def guard(step: kerman.PreStep, next: Any) -> Any:
        if any("forbidden" in m.text for m in step.messages):
            return kerman.Reject("no forbidden topics")
        return await next()

    loop.on("agent/error", lambda e: None)  # the tool's bug is reported; keep the output quiet
    loop.followup("what is kerman?")
    await loop.when_idle()
    loop.followup("try")
    await loop.when_idle()
    loop.followup("a forbidden topic")
    await loop.when_idle()
    loop.followup("a long job")
    await streaming.wait()
    loop.cancel()
    await loop.when_idle()
    await loop.aclose()
    log.append("plugin/note", {"note": "kept", "n": 1})
    return list(log.events()), log


@pytest.fixture(scope="module")
def session() -> list[kerman.Event]:
    import logging

    logger = logging.getLogger("kerman")
    level, logger.disabled = logger.disabled, True
    try:
        recorded, log = asyncio.run(_record_session())
    finally:
        logger.disabled = level
    log.close()
    return recorded


def _of(session: list[kerman.Event], cls: type[events.EventView]) -> list[Any]:
    return [v for v in events.views(session) if isinstance(v, cls)]


def test_every_type_the_loop_and_inbox_write_has_its_view(session: list[kerman.Event]) -> None:
    seen = {e.type for e in session}
    assert seen - set(events.TYPES) == {"plugin/note"}
    # repair's, below; the decisions' in tests/python/decisions/test_views.py; the structured
    # output's in tests/python/providers/test_structured_output.py; compaction's in
    # tests/python/compaction/test_compaction_views.py
    assert set(events.TYPES) - seen == {
        events.CONTEXT_COMPACTED,
        events.LOG_DAMAGED,
        events.LOG_REPAIRED,
        events.DECISION_REQUESTED,
        events.DECISION_RESOLVED,
        events.OUTPUT_VALIDATED,
        events.TOOL_PROGRESS,  # tests/python/mcp/test_mcp_progress_log.py
    }
    for event in session:
        v = events.view(event)
        assert type(v) is events.TYPES.get(event.type, events.OtherEvent)
        assert (v.seq, v.time, v.type, v.data) == (event.seq, event.time, event.type, event.data)
        assert v.source_event_seqs == event.source_event_seqs


def test_turn_and_step_bounds(session: list[kerman.Event]) -> None:
    starts = _of(session, events.TurnStart)
    assert [s.turn for s in starts] == [1, 2, 3, 4]
    ends = _of(session, events.TurnEnd)
    assert [(e.turn, e.reason.kind) for e in ends] == [(1, "completed"), (2, "error"), (3, "blocked"), (4, "aborted")]
    steps = _of(session, events.StepStart)
    assert [(s.turn, s.step) for s in steps] == [(1, 1), (1, 2), (1, 3), (2, 1), (4, 1)]
    assert [(s.turn, s.step) for s in _of(session, events.StepEnd)] == [(1, 1), (1, 2), (1, 3), (2, 1), (4, 1)]


def test_failure_rejection_and_cancel(session: list[kerman.Event]) -> None:
    failed, blocked, aborted = _of(session, events.TurnEnd)[1:]
    error = failed.reason.error
    assert error is not None
    assert (error.message, error.code, error.status) == ("rate limited", "RATE_LIMITED", 429)
    assert failed.reason.cause is None and failed.reason.blocked_reason is None
    assert blocked.reason.blocked_reason == "no forbidden topics" and blocked.reason.error is None
    cause = aborted.reason.cause
    assert cause is not None and cause.kind == "user"
    interrupted = _of(session, events.AssistantMessageEvent)[-1]
    assert interrupted.interrupted and interrupted.message.text == "Working" and interrupted.turn == 4


def test_streamed_chunks(session: list[kerman.Event]) -> None:
    chunks = [c.chunk for c in _of(session, events.AssistantChunk) if c.turn == 1 and c.step == 1]
    assert [type(c) for c in chunks] == [
        events.ReasoningDelta,
        events.TextDelta,
        events.TextDelta,
        events.ToolCallChunk,
        events.UsageChunk,
        events.FinishChunk,
    ]
    reasoning, hello, look, call, usage, finish = chunks
    assert isinstance(reasoning, events.ReasoningDelta) and reasoning.text == "look it up"
    assert isinstance(hello, events.TextDelta) and hello.text + look.raw["text"] == "Let me look."
    assert isinstance(call, events.ToolCallChunk) and (call.id, call.name, call.arguments) == ("c1", "lookup", '{"q": "k"}')
    assert isinstance(usage, events.UsageChunk) and (usage.usage.input, usage.usage.output) == (5, 3)
    assert usage.usage.get("vendorCount") == 7  # an unknown field, kept
    assert isinstance(finish, events.FinishChunk) and finish.reason == "stop" and finish.error is None


def test_assistant_message_and_usage(session: list[kerman.Event]) -> None:
    first = _of(session, events.AssistantMessageEvent)[0]
    message = first.message
    assert (message.role, message.source.kind, message.text, message.reasoning) == ("assistant", "model", "Let me look.", "look it up")
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == [("c1", "lookup", '{"q": "k"}')]
    assert [type(b) for b in message.content] == [events.ReasoningBlock, events.TextBlock, events.ToolCallBlock]
    assert not first.interrupted
    assert first.usage is not None and (first.usage.input, first.usage.output, first.usage.cache_read) == (5, 3, 0)
    assert first.source_event_seqs and all(session[s].type == events.ASSISTANT_CHUNK for s in first.source_event_seqs)
    assert kerman.Message.from_dict(message.raw).text == "Let me look."


def test_tool_calls_and_results(session: list[kerman.Event]) -> None:
    calls = _of(session, events.ToolCall)
    assert [(c.call_id, c.name, c.arguments, c.step) for c in calls] == [
        ("c1", "lookup", '{"q": "k"}', 1),
        ("c2", "broken", "{}", 2),
        ("c3", "missing", "{}", 2),
    ]
    ok, raised, unknown = _of(session, events.ToolResultEvent)
    assert (ok.call_id, ok.text, ok.is_error, ok.error) == ("c1", "k: found", False, None)
    assert ok.message.source.call_id == "c1" and ok.source_event_seqs == [calls[0].seq]
    assert raised.call_id == "c2" and raised.is_error and "the disk is on fire" in raised.text
    assert raised.error is not None and (raised.error.name, raised.error.code) == ("RuntimeError", "TOOL_ERROR")
    assert raised.error.function is not None and raised.error.traceback is not None
    assert unknown.error is not None and unknown.error.code == "UNKNOWN_TOOL"
    block = unknown.message.tool_result
    assert block is not None and block.is_error and block.tool_call_id == "c3"


def test_user_messages_request_header_and_instructions(session: list[kerman.Event]) -> None:
    users = _of(session, events.UserMessageEvent)
    assert [u.message.text for u in users] == ["what is kerman?", "try", "a long job"]
    assert users[0].message.source.kind == "user" and users[0].message.id
    assert [i.instructions for i in _of(session, events.InstructionsChanged)] == ["Be brief."]
    header = _of(session, events.RequestHeader)[0]
    assert header.instructions == "Be brief." and header.options == {}


def test_inbox_splices(session: list[kerman.Event]) -> None:
    splices = _of(session, events.InboxSpliced)
    inserted = [s for s in splices if s.inserted]
    assert [s.inserted[0].text for s in inserted] == ["what is kerman?", "try", "a forbidden topic", "a long job"]
    assert all(s.target == "next-turn" and s.removed_count == 0 and not s.is_claim for s in inserted)
    claims = [s for s in splices if s.is_claim]
    assert len(claims) == 4 and all(s.removed_count == 1 and s.start == 0 for s in claims)


def test_plugin_types_and_unknown_fields_are_kept(session: list[kerman.Event]) -> None:
    note = events.view(session[-1])
    assert isinstance(note, events.OtherEvent) and note.type == "plugin/note" and note.data == {"note": "kept", "n": 1}
    odd = events.view(
        {
            "type": "tool/call",
            "seq": 3,
            "time": 9,
            "data": {"callId": "x", "name": "n", "arguments": "{}", "turn": 1, "step": 2, "future": [1]},
        }
    )
    assert isinstance(odd, events.ToolCall) and (odd.call_id, odd.seq, odd.time) == ("x", 3, 9)
    assert odd.data["future"] == [1]
    # a payload of the wrong shape reads as defaults rather than raising
    broken = events.view({"type": "turn/end", "seq": 0, "data": "not a dict"})
    assert isinstance(broken, events.TurnEnd) and broken.turn == 0 and broken.reason.kind is None
    with pytest.raises(TypeError, match="expected a kerman.Event"):
        events.view({"data": {}})


def test_repair_records(store_root: Path) -> None:
    records = [event_record(s, "plugin/x", {"n": s}) for s in range(3)]
    records[1] = b"00000000 " + b'{"type":"plugin/x","seq":1,"time":1,"data":{}}\n'  # a bad checksum
    write_raw_session(session_path(store_root, "r"), header_record("r"), records)
    store = kerman.FileStore(store_root, durability="none")
    store.repair("r")
    _, repaired, _ = store._read("r")
    damaged = events.view(repaired[1])
    assert isinstance(damaged, events.LogDamaged) and damaged.seqs == [1, 1] and damaged.backup
    closing = events.view(repaired[-1])
    assert isinstance(closing, events.LogRepaired)
    assert closing.lost_seqs == [[1, 1]] and closing.torn_tail_bytes == 0 and closing.quarantine
    assert [d.get("line") for d in closing.dropped] == [3]


def test_live_tail_gives_views() -> None:
    async def main() -> tuple[list[type[events.EventView]], list[str]]:
        log = kerman.MemoryStore().create()
        loop = kerman.AgentLoop(kerman.models.EchoModel(), log=log)
        loop.followup("hi")
        await loop.when_idle()
        await loop.aclose()
        log.append("plugin/y", {})
        types = [e.type for e in log.events()]
        log.close()
        return [type(v) async for v in events.aviews(log.tail())], types

    seen, types = asyncio.run(main())
    assert seen == [events.TYPES.get(t, events.OtherEvent) for t in types]
    assert events.TurnStart in seen and events.AssistantMessageEvent in seen and seen[-1] is events.OtherEvent


def test_unknown_chunks_and_blocks_keep_their_data() -> None:
    cited = events.view(
        {"type": "assistant/chunk", "seq": 1, "time": 2, "data": {"turn": 1, "step": 1, "chunk": {"type": "citation", "url": "u"}}}
    )
    assert isinstance(cited, events.AssistantChunk) and isinstance(cited.chunk, events.OtherChunk)
    assert cited.chunk.type == "citation" and cited.chunk.raw == {"type": "citation", "url": "u"}
    failed = events.chunk({"type": "finish", "reason": "error", "error": {"message": "reset", "code": "NETWORK", "hint": 1}})
    assert isinstance(failed, events.FinishChunk) and failed.error is not None
    assert (failed.error.message, failed.error.code, failed.error.get("hint")) == ("reset", "NETWORK", 1)
    message = events.message(
        {"id": "m", "role": "user", "source": {"kind": "user"}, "content": [{"type": "image", "ref": "x"}, {"type": "text", "text": "a"}]}
    )
    assert [type(b) for b in message.content] == [events.OtherBlock, events.TextBlock]
    assert message.text == "a" and message.content[0].get("ref") == "x" and message.tool_result is None
