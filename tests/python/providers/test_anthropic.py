"""Anthropic on the wire: the exact body of a two-step tool turn (parallel results in one user
turn), signed and redacted thinking sent back — in the same process, after a restart (read back
from the log) and from a non-streamed reply — unsigned thinking left out, a rewritten message
not given another message's signature, an error event mid-stream, error results and images in
tool results, and a hand-written event stream."""

from __future__ import annotations

from provider_helpers import asynctest, chunks, clock, done, failure, make, messages, run, turn_ends

import kerman
from kerman.providers.testing import FakeServer, HttpError, Raw, Reply, ToolCall

P = "anthropic"


@asynctest
async def test_a_two_step_tool_turn_sends_the_messages_anthropic_expects():
    with FakeServer(P) as server:
        server.add(
            Reply(
                text="Let me check.",
                tool_calls=[ToolCall("toolu_a", "clock", '{"tz": "UTC"}', pieces=3), ToolCall("toolu_b", "clock", "{}")],
            ),
            Reply(text="Noon."),
        )
        model = make(P, server, instructions="Be brief.", max_tokens=512)
        loop = await run(model, "What time is it?", tools=[clock])
        second = server.requests[1].body
        assert second["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "What time is it?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_a", "name": "clock", "input": {"tz": "UTC"}},
                    {"type": "tool_use", "id": "toolu_b", "name": "clock", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "12:00"},
                    {"type": "tool_result", "tool_use_id": "toolu_b", "content": "12:00"},
                ],
            },
        ]
        assert second["system"] == "Be brief." and second["max_tokens"] == 512 and second["stream"] is True
        assert second["tools"] == [
            {"name": "clock", "description": "Returns the time.", "input_schema": {"type": "object", "properties": {}}}
        ]
        await done(loop, model)


THOUGHT = {"type": "thinking", "thinking": "The user wants the time.", "signature": "sig-AAAA"}


@asynctest
async def test_signed_thinking_is_sent_back_with_its_signature():
    with FakeServer(P) as server:
        server.add(
            Reply(
                reasoning=["The user ", "wants the time."],
                signature="sig-AAAA",
                redacted="opaque-BBBB",
                tool_calls=[ToolCall("toolu_a", "clock", "{}")],
            ),
            Reply(text="Noon."),
        )
        model = make(P, server, thinking={"type": "enabled", "budget_tokens": 1024})
        loop = await run(model, "time?", tools=[clock])
        assert [c for c in chunks(loop.log) if c["type"] == "reasoning-delta"] == [
            {"type": "reasoning-delta", "text": "The user "},
            {"type": "reasoning-delta", "text": "wants the time."},
        ]
        [data] = [c for c in chunks(loop.log) if c["type"] == "provider-data"]
        assert data["provider"] == "anthropic"
        assistant = server.requests[1].body["messages"][1]["content"]
        assert assistant == [
            THOUGHT,
            {"type": "redacted_thinking", "data": "opaque-BBBB"},
            {"type": "tool_use", "id": "toolu_a", "name": "clock", "input": {}},
        ]
        assert server.requests[0].body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
        await done(loop, model)


@asynctest
async def test_signed_thinking_survives_a_restart(tmp_path):
    store = kerman.FileStore(tmp_path / "sessions")
    with FakeServer(P) as server:
        server.add(
            Reply(reasoning="The user wants the time.", signature="sig-AAAA", tool_calls=[ToolCall("toolu_a", "clock", "{}")]),
            Reply(text="Noon."),
            Reply(text="Bye."),
        )
        model = make(P, server)
        log = store.create("s")
        loop = await run(model, "time?", tools=[clock], log=log)
        await done(loop, model)
        log.close()

        fresh = make(P, server)  # a new process: nothing in memory
        with store.open("s") as log:
            loop = await run(fresh, "thanks", log=log)
            assert turn_ends(log)[-1] == {"kind": "completed"}
            assert server.requests[2].body["messages"][1]["content"][0] == THOUGHT
            await done(loop, fresh)


@asynctest
async def test_a_non_streamed_reply_keeps_the_signature_in_its_block():
    with FakeServer(P) as server:
        server.add(
            Reply(reasoning="The user wants the time.", signature="sig-AAAA", tool_calls=[ToolCall("toolu_a", "clock", "{}")]),
            Reply(text="Noon."),
        )
        model = make(P, server, stream=False)
        loop = await run(model, "time?", tools=[clock])
        assert messages(loop.log)[0]["message"]["content"][0] == {
            "type": "reasoning",
            "text": "The user wants the time.",
            "anthropic": {"signature": "sig-AAAA"},
        }
        assert server.requests[1].body["messages"][1]["content"][0] == THOUGHT
        await done(loop, model)


@asynctest
async def test_unsigned_reasoning_is_left_out():
    # Reasoning another model produced (or an interrupted stream kept) has no signature: the API
    # would refuse it, so it is not sent.
    log = kerman.MemoryStore().create()
    earlier = kerman.models.ScriptedModel([[{"type": "reasoning-delta", "text": "hidden"}, {"type": "text-delta", "text": "Hi."}]])
    loop = await run(earlier, "hello", log=log)
    await loop.aclose()
    with FakeServer(P) as server:
        server.add(Reply(text="Hello again."))
        model = make(P, server)
        loop = await run(model, "again", log=log)
        assert server.requests[0].body["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "hello"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]},
            {"role": "user", "content": [{"type": "text", "text": "again"}]},
        ]
        await done(loop, model)


@asynctest
async def test_a_rewritten_message_does_not_get_the_original_signature():
    with FakeServer(P) as server:
        server.add(
            Reply(reasoning="The user wants the time.", signature="sig-AAAA", tool_calls=[ToolCall("toolu_a", "clock", "{}")]),
            Reply(text="Noon."),
        )
        model = make(P, server)
        loop = kerman.AgentLoop(model)
        loop.tool(clock)

        @loop.before_request
        async def rewrite(request, next):  # same id, other content: the signature is not for it
            request.messages = [
                m.with_content([{"type": "reasoning", "text": "edited"}] + m.tool_calls) if m.role == "assistant" else m
                for m in request.messages
            ]
            return await next()

        await run(model, "time?", loop=loop)
        assert server.requests[1].body["messages"][1]["content"] == [{"type": "tool_use", "id": "toolu_a", "name": "clock", "input": {}}]
        await done(loop, model)


@asynctest
async def test_an_overloaded_error_event_mid_stream():
    with FakeServer(P) as server:
        server.add(Reply(text=["a", "b"], error=HttpError(529, "Overloaded"), error_after=5))
        model = make(P, server, retry=None)
        loop = await run(model, "go")
        error = failure(loop.log)
        assert (error["code"], error["exceptionType"]) == ("OVERLOADED", "OverloadedError") and "status" not in error
        assert "Overloaded" in error["message"]
        await done(loop, model)


@asynctest
async def test_error_results_and_images_in_tool_results():
    with FakeServer(P) as server:
        server.add(Reply(tool_calls=[ToolCall("toolu_a", "shot", "{}"), ToolCall("toolu_b", "broken", "{}")]), Reply(text="ok"))
        model = make(P, server)

        async def shot(args, ctx):
            """A screenshot."""
            return kerman.ToolResult([{"type": "text", "text": "here"}, {"type": "image", "mediaType": "image/png", "data": "AAAA"}])

        async def broken(args, ctx):
            """Fails."""
            raise ValueError("no disk")

        loop = await run(model, "go", tools=[shot, broken])
        results = server.requests[1].body["messages"][2]["content"]
        assert results[0] == {
            "type": "tool_result",
            "tool_use_id": "toolu_a",
            "content": [
                {"type": "text", "text": "here"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            ],
        }
        assert results[1]["tool_use_id"] == "toolu_b" and results[1]["is_error"] is True and "no disk" in results[1]["content"]
        await done(loop, model)


def event(name, **data):
    return (name, dict(type=name, **data))


@asynctest
async def test_a_hand_written_event_stream():
    stream = Raw(
        headers={"content-type": "text/event-stream"},
        body=[
            event(
                "message_start",
                message={
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 5, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 3, "output_tokens": 1},
                },
            ),
            event("ping"),
            event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            event("content_block_delta", index=0, delta={"type": "text_delta", "text": "On it."}),
            event("content_block_stop", index=0),
            event("content_block_start", index=1, content_block={"type": "tool_use", "id": "toolu_9", "name": "clock", "input": {}}),
            event("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": ""}),
            event("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": '{"tz": "U'}),
            event("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": 'TC"}'}),
            event("content_block_stop", index=1),
            event("message_delta", delta={"stop_reason": "tool_use", "stop_sequence": None}, usage={"output_tokens": 17}),
            event("message_stop"),
        ],
    )
    with FakeServer(P) as server:
        server.add(stream, Reply(text="Noon."))
        model = make(P, server)
        loop = await run(model, "go", tools=[clock])
        first = [c for c in chunks(loop.log)][:4]
        assert first == [
            {"type": "text-delta", "text": "On it."},
            {"type": "tool-call", "id": "toolu_9", "name": "clock", "arguments": '{"tz": "UTC"}'},
            {
                "type": "usage",
                "input": 28,
                "output": 17,
                "cacheRead": 20,
                "cacheWrite": 3,
                "reasoning": 0,
                "model": "m",
                "provider": "anthropic",
            },
            {"type": "finish", "reason": "stop", "providerReason": "tool_use"},
        ]
        await done(loop, model)


@asynctest
async def test_redacted_thinking_alone_is_sent_back():
    with FakeServer(P) as server:
        server.add(Reply(redacted="opaque-CCCC", tool_calls=[ToolCall("toolu_a", "clock", "{}")]), Reply(text="Noon."))
        model = make(P, server)
        loop = await run(model, "time?", tools=[clock])
        assert messages(loop.log)[0]["message"]["content"] == [{"type": "tool-call", "id": "toolu_a", "name": "clock", "arguments": "{}"}]
        assert server.requests[1].body["messages"][1]["content"] == [
            {"type": "redacted_thinking", "data": "opaque-CCCC"},
            {"type": "tool_use", "id": "toolu_a", "name": "clock", "input": {}},
        ]
        await done(loop, model)


def thinking_block(index, text, signature):
    return [
        event("content_block_start", index=index, content_block={"type": "thinking", "thinking": "", "signature": ""}),
        event("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": text}),
        event("content_block_delta", index=index, delta={"type": "signature_delta", "signature": signature}),
        event("content_block_stop", index=index),
    ]


def tool_block(index, call_id):
    return [
        event("content_block_start", index=index, content_block={"type": "tool_use", "id": call_id, "name": "clock", "input": {}}),
        event("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": "{}"}),
        event("content_block_stop", index=index),
    ]


START = event(
    "message_start",
    message={
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    },
)
END = [event("message_delta", delta={"stop_reason": "tool_use", "stop_sequence": None}, usage={"output_tokens": 9}), event("message_stop")]


@asynctest
async def test_adjacent_and_interleaved_thinking_blocks_keep_their_own_signatures():
    # The loop merges adjacent reasoning deltas into one block; each thinking block still goes
    # back on its own, with its own signature, in the order the model wrote them.
    stream = Raw(
        headers={"content-type": "text/event-stream"},
        body=[
            START,
            *thinking_block(0, "First. ", "sig-1"),
            *thinking_block(1, "Second.", "sig-2"),
            *tool_block(2, "toolu_a"),
            *thinking_block(3, "Third.", "sig-3"),
            *tool_block(4, "toolu_b"),
            *END,
        ],
    )
    with FakeServer(P) as server:
        server.add(stream, Reply(text="Noon."))
        model = make(P, server)
        loop = await run(model, "go", tools=[clock])
        assert messages(loop.log)[0]["message"]["content"] == [
            {"type": "reasoning", "text": "First. Second."},
            {"type": "tool-call", "id": "toolu_a", "name": "clock", "arguments": "{}"},
            {"type": "reasoning", "text": "Third."},
            {"type": "tool-call", "id": "toolu_b", "name": "clock", "arguments": "{}"},
        ]
        assert server.requests[1].body["messages"][1]["content"] == [
            {"type": "thinking", "thinking": "First. ", "signature": "sig-1"},
            {"type": "thinking", "thinking": "Second.", "signature": "sig-2"},
            {"type": "tool_use", "id": "toolu_a", "name": "clock", "input": {}},
            {"type": "thinking", "thinking": "Third.", "signature": "sig-3"},
            {"type": "tool_use", "id": "toolu_b", "name": "clock", "input": {}},
        ]
        await done(loop, model)
