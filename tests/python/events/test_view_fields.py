"""The views' field reads on payloads an older or newer writer could have written: a field held
with another JSON type reads as ``None`` or its documented default, a message's accessors skip
what is not a block, and an event given as its dict reads as the same event does."""

from __future__ import annotations

from typing import Any

from kerman import events


def _event(kind: str, data: Any, seq: int = 4) -> dict[str, Any]:
    return {"seq": seq, "time": 7, "type": kind, "data": data}


def test_bounds_and_chunks_with_other_json_types() -> None:
    start = events.view(_event("step/start", {"turn": "1", "step": True}))
    assert isinstance(start, events.StepStart) and (start.turn, start.step) == (0, 0)
    not_an_object = events.view(_event("assistant/chunk", ["text-delta"]))
    assert isinstance(not_an_object, events.AssistantChunk)
    assert isinstance(not_an_object.chunk, events.OtherChunk) and not_an_object.chunk.raw == {}
    delta = events.view(_event("assistant/chunk", {"turn": 2, "step": 3, "chunk": {"type": "text-delta", "text": 5}}))
    assert isinstance(delta, events.AssistantChunk) and (delta.turn, delta.step, delta.seq, delta.time) == (2, 3, 4, 7)
    assert isinstance(delta.chunk, events.TextDelta) and delta.chunk.text == "" and delta.chunk.raw["text"] == 5
    end = events.view(_event("turn/end", {"turn": 1, "reason": "completed"}))
    assert isinstance(end, events.TurnEnd) and end.reason.kind is None and end.reason.raw == {}


def test_splice_fields_and_claims() -> None:
    message = {"id": "m1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
    claim = events.view(_event("agent/inbox/spliced", {"target": "next-step", "start": 0, "removedCount": 2, "inserted": [message]}))
    assert isinstance(claim, events.InboxSpliced)
    assert (claim.target, claim.start, claim.removed_count, claim.outcome, claim.is_claim) == ("next-step", 0, 2, None, True)
    assert [(m.id, m.text, m.source.kind) for m in claim.inserted] == [("m1", "hi", "user")]
    cancel = events.InboxSpliced(
        _event("agent/inbox/spliced", {"target": "next-turn", "start": 1, "removedCount": 1, "inserted": [], "outcome": "canceled"})
    )
    assert (cancel.removed_count, cancel.is_claim) == (1, False)
    odd = events.InboxSpliced(_event("agent/inbox/spliced", {"target": 3, "start": "0", "removedCount": True, "inserted": {}}))
    assert (odd.target, odd.start, odd.removed_count, odd.inserted, odd.is_claim) == ("", 0, 0, [], False)
    not_an_object = events.InboxSpliced(_event("agent/inbox/spliced", None))
    assert (not_an_object.removed_count, not_an_object.is_claim, not_an_object.inserted) == (0, False, [])


def test_message_accessors_skip_what_is_not_a_block() -> None:
    view = events.message(
        {
            "id": 9,
            "content": [
                "loose text",
                {"type": "reasoning", "text": "first"},
                {"type": "reasoning", "text": 2},
                {"type": "text", "text": "a"},
                {"type": "tool-call", "id": "c1", "name": "f", "arguments": "{}"},
                7,
                {"type": "tool-call", "id": "c2"},
                {"type": "tool-result", "toolCallId": "c1", "content": "r1"},
                {"type": "tool-result", "toolCallId": "c2"},
            ],
        }
    )
    assert view.id == "" and view.text == "a"
    assert view.reasoning == "first\n"  # a block whose text is not a string reads as ""
    assert [(c.id, c.name, c.arguments) for c in view.tool_calls] == [("c1", "f", "{}"), ("c2", "", "")]
    result = view.tool_result
    assert isinstance(result, events.ToolResultBlock) and (result.tool_call_id, result.text) == ("c1", "r1")
    assert [type(b).__name__ for b in view.content] == [
        "ReasoningBlock",
        "ReasoningBlock",
        "TextBlock",
        "ToolCallBlock",
        "ToolCallBlock",
        "ToolResultBlock",
        "ToolResultBlock",
    ]
    assert events.message({"content": "whole"}).tool_calls == [] and events.message({}).tool_result is None


def test_tool_result_reads_its_block_and_falls_back_to_the_source() -> None:
    data = {
        "turn": 1,
        "step": 1,
        "message": {
            "id": "r",
            "source": {"kind": "tool", "callId": "from-source"},
            "content": [{"type": "tool-result", "content": [{"type": "text", "text": "boom"}], "isError": True}],
        },
    }
    result = events.view(_event("tool/result", data))
    assert isinstance(result, events.ToolResultEvent)
    assert (result.call_id, result.text, result.is_error, result.error) == ("from-source", "boom", True, None)
    plain = events.view(_event("tool/result", {"message": {"content": []}, "error": {"message": "no", "code": "X"}}))
    assert isinstance(plain, events.ToolResultEvent)
    assert (plain.call_id, plain.text, plain.is_error) == ("", "", True)
    assert plain.error is not None and (plain.error.message, plain.error.code) == ("no", "X")


def test_tool_call_fields() -> None:
    call = events.view(_event("tool/call", {"callId": 1, "name": None, "arguments": {"q": 1}}))
    assert isinstance(call, events.ToolCall) and (call.call_id, call.name, call.arguments) == ("", "", {"q": 1})
    bare = events.view(_event("tool/call", {}))
    assert isinstance(bare, events.ToolCall) and bare.arguments == ""
