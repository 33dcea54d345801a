"""OpenAIChat on the wire: the exact body of a two-step tool turn, the switches for
OpenAI-compatible servers, reasoning deltas, hand-written SSE transcripts (parallel calls by
index, calls that all say index 0, a call without an id, a ``reasoning`` field), an error
chunk mid-stream and an exhausted quota."""

from __future__ import annotations

import json

from provider_helpers import asynctest, chunks, clock, done, failure, make, messages, run, turn_ends

from kerman.providers.testing import FakeServer, HttpError, Raw, Reply, ToolCall

P = "openai-chat"


def sse(*deltas, finish="stop", usage=None):
    """A hand-written Chat Completions stream: one chunk per delta, a finish chunk, usage, [DONE]."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [dict(base, choices=[{"index": 0, "delta": d, "finish_reason": None}]) for d in deltas]
    events.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]))
    if usage is not None:
        events.append(dict(base, choices=[], usage=usage))
    events.append("[DONE]")
    return Raw(headers={"content-type": "text/event-stream"}, body=events)


@asynctest
async def test_a_two_step_tool_turn_sends_the_messages_openai_expects():
    with FakeServer(P) as server:
        server.add(
            Reply(text="Let me check.", tool_calls=[ToolCall("call_a", "clock", '{"tz":"UTC"}'), ToolCall("call_b", "clock", "{}")]),
            Reply(text="Noon."),
        )
        model = make(P, server, instructions="Be brief.")
        loop = await run(model, "What time is it?", tools=[clock])
        first, second = (r.body for r in server.requests)
        assert first["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What time is it?"}]
        assert second["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What time is it?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "clock", "arguments": '{"tz":"UTC"}'}},
                    {"id": "call_b", "type": "function", "function": {"name": "clock", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "12:00"},
            {"role": "tool", "tool_call_id": "call_b", "content": "12:00"},
        ]
        assert second["tools"] == [
            {
                "type": "function",
                "function": {"name": "clock", "description": "Returns the time.", "parameters": {"type": "object", "properties": {}}},
            }
        ]
        assert second["model"] == "fake-model" and second["stream"] is True
        assert second["stream_options"] == {"include_usage": True}
        assert "parallel_tool_calls" not in second and "max_completion_tokens" not in second
        assert server.requests[0].headers["authorization"].startswith("Bearer ")
        await done(loop, model)


@asynctest
async def test_switches_for_compatible_servers():
    with FakeServer(P) as server:
        server.add(Reply(text="a", usage={"input": 3, "output": 1}), Reply(text="b"), Reply(text="c"))
        plain = make(
            P,
            server,
            stream_usage=False,
            max_tokens=100,
            max_tokens_field="max_tokens",
            parallel_tool_calls=False,
            instructions="sys",
            instructions_role="developer",
        )
        loop = await run(plain, "one", tools=[clock])
        body = server.requests[0].body
        assert "stream_options" not in body
        assert body["max_tokens"] == 100 and "max_completion_tokens" not in body
        assert body["parallel_tool_calls"] is False
        assert body["messages"][0] == {"role": "developer", "content": "sys"}
        assert [c for c in chunks(loop.log) if c["type"] == "usage"] == []  # no stream_options: no usage chunk
        await done(loop, plain)

        default = make(P, server, max_tokens=50, parallel_tool_calls=True)
        loop = await run(default, "two")  # no tools: parallel_tool_calls is not sent
        body = server.requests[1].body
        assert body["max_completion_tokens"] == 50 and "parallel_tool_calls" not in body
        await done(loop, default)


@asynctest
async def test_reasoning_content_is_kept_and_sent_back_only_when_asked():
    for send, expected in ((False, None), (True, "Think hard.")):
        with FakeServer(P) as server:
            server.add(
                Reply(reasoning=["Think", " hard."], text="Calling.", tool_calls=[ToolCall("c1", "clock", "{}")]), Reply(text="Noon.")
            )
            model = make(P, server, send_reasoning=send)
            loop = await run(model, "time?", tools=[clock])
            assert [c for c in chunks(loop.log) if c["type"] == "reasoning-delta"] == [
                {"type": "reasoning-delta", "text": "Think"},
                {"type": "reasoning-delta", "text": " hard."},
            ]
            assert messages(loop.log)[0]["message"]["content"][0] == {"type": "reasoning", "text": "Think hard."}
            assistant = server.requests[1].body["messages"][1]
            assert assistant.get("reasoning_content") == expected
            await done(loop, model)


@asynctest
async def test_a_hand_written_stream_with_parallel_calls_by_index():
    with FakeServer(P) as server:
        server.add(
            sse(
                {"role": "assistant", "content": ""},
                {"tool_calls": [{"index": 0, "id": "call_x", "type": "function", "function": {"name": "clock", "arguments": ""}}]},
                {"tool_calls": [{"index": 1, "id": "call_y", "type": "function", "function": {"name": "clock", "arguments": '{"a'}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": '{"tz":'}}]},
                {"tool_calls": [{"index": 1, "function": {"arguments": '":1}'}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": '"UTC"}'}}]},
                finish="tool_calls",
                usage={"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
            ),
            Reply(text="done"),
        )
        model = make(P, server)
        loop = await run(model, "go", tools=[clock])
        calls = [c for c in chunks(loop.log) if c["type"] == "tool-call"]
        assert calls == [
            {"type": "tool-call", "id": "call_x", "name": "clock", "arguments": '{"tz":"UTC"}'},
            {"type": "tool-call", "id": "call_y", "name": "clock", "arguments": '{"a":1}'},
        ]
        assert [c for c in chunks(loop.log) if c["type"] == "usage"][0] == {
            "type": "usage",
            "input": 9,
            "output": 4,
            "cacheRead": 0,
            "cacheWrite": 0,
            "reasoning": 0,
            "model": "m",
            "provider": "openai",
        }
        assert turn_ends(loop.log) == [{"kind": "completed"}]
        await done(loop, model)


@asynctest
async def test_calls_that_all_say_index_0_are_told_apart_by_their_ids():
    # Some servers send each complete call in one delta, every one with index 0.
    with FakeServer(P) as server:
        server.add(
            sse(
                {"tool_calls": [{"index": 0, "id": "a1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}]},
                {"tool_calls": [{"index": 0, "id": "a2", "type": "function", "function": {"name": "clock", "arguments": "{}"}}]},
                finish="tool_calls",
            ),
            Reply(text="done"),
        )
        model = make(P, server)
        loop = await run(model, "go", tools=[clock])
        assert [c["id"] for c in chunks(loop.log) if c["type"] == "tool-call"] == ["a1", "a2"]
        await done(loop, model)


@asynctest
async def test_a_call_without_an_id_gets_one_and_keeps_it():
    with FakeServer(P) as server:
        server.add(
            sse({"tool_calls": [{"index": 0, "type": "function", "function": {"name": "clock", "arguments": "{}"}}]}, finish="tool_calls"),
            Reply(text="done"),
        )
        model = make(P, server)
        loop = await run(model, "go", tools=[clock])
        [call] = [c for c in chunks(loop.log) if c["type"] == "tool-call"]
        assert call["id"].startswith("kerman_")
        second = server.requests[1].body["messages"]
        assert second[1]["tool_calls"][0]["id"] == call["id"] and second[2]["tool_call_id"] == call["id"]
        await done(loop, model)


@asynctest
async def test_a_reasoning_field_named_reasoning_is_read_too():
    with FakeServer(P) as server:
        server.add(sse({"reasoning": "Hmm."}, {"content": "Yes."}))
        model = make(P, server)
        loop = await run(model, "go")
        assert messages(loop.log)[0]["message"]["content"] == [{"type": "reasoning", "text": "Hmm."}, {"type": "text", "text": "Yes."}]
        await done(loop, model)


@asynctest
async def test_an_error_chunk_mid_stream_is_classified():
    with FakeServer(P) as server:
        server.add(Reply(text=["a", "b"], error=HttpError(500, "The server had an error", kind="server_error"), error_after=2))
        model = make(P, server, retry=None)
        loop = await run(model, "go")
        error = failure(loop.log)
        assert error["code"] == "SERVER_ERROR" and "status" not in error
        assert "The server had an error" in error["message"]
        await done(loop, model)


@asynctest
async def test_an_exhausted_quota_is_not_a_plain_rate_limit():
    with FakeServer(P) as server:
        server.add(HttpError(429, "You exceeded your current quota", kind="insufficient_quota"))
        model = make(P, server)
        loop = await run(model, "go")
        error = failure(loop.log)
        assert (error["code"], error["exceptionType"]) == ("QUOTA_EXCEEDED", "RateLimitError")
        await done(loop, model)


@asynctest
async def test_a_user_message_of_several_text_blocks_is_one_string():
    import kerman

    with FakeServer(P) as server:
        server.add(Reply(text="ok"))
        model = make(P, server)
        loop = await run(model, kerman.UserMessage([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]))
        assert server.requests[0].body["messages"] == [{"role": "user", "content": "a\nb"}]
        assert json.loads(server.requests[0].raw)["messages"][0]["content"] == "a\nb"
        await done(loop, model)
