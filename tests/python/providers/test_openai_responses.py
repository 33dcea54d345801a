"""OpenAIResponses on the wire: the exact input items of a two-step tool turn without reasoning
(plain items, no ids), with reasoning under ``store=False`` (the reasoning item with its
encrypted content and the items after it sent back by id — also after a restart, and from a
non-streamed reply), summary parts, refusals, and failures reported in the stream."""

from __future__ import annotations

from provider_helpers import asynctest, chunks, clock, done, failure, make, messages, run, turn_ends

import kerman
from kerman.providers.testing import FakeServer, HttpError, Raw, Reply, ToolCall

P = "openai-responses"


@asynctest
async def test_a_two_step_tool_turn_without_reasoning_sends_plain_items():
    with FakeServer(P) as server:
        server.add(
            Reply(
                text="Let me check.", tool_calls=[ToolCall("call_a", "clock", '{"tz":"UTC"}', pieces=3), ToolCall("call_b", "clock", "{}")]
            ),
            Reply(text="Noon."),
        )
        model = make(P, server, instructions="Be brief.")
        loop = await run(model, "What time is it?", tools=[clock])
        second = server.requests[1].body
        assert second["input"] == [
            {"role": "user", "content": "What time is it?"},
            {"role": "assistant", "content": "Let me check."},
            {"type": "function_call", "call_id": "call_a", "name": "clock", "arguments": '{"tz":"UTC"}'},
            {"type": "function_call", "call_id": "call_b", "name": "clock", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "12:00"},
            {"type": "function_call_output", "call_id": "call_b", "output": "12:00"},
        ]
        assert second["instructions"] == "Be brief." and second["stream"] is True
        assert second["tools"] == [
            {
                "type": "function",
                "name": "clock",
                "description": "Returns the time.",
                "parameters": {"type": "object", "properties": {}},
                "strict": False,
            }
        ]
        assert "include" not in second and [c for c in chunks(loop.log) if c["type"] == "provider-data"] == []
        await done(loop, model)


REASONING = {
    "type": "reasoning",
    "id": "rs_fake1",
    "encrypted_content": "ENC-1",
    "summary": [{"type": "summary_text", "text": "Need the clock."}],
}


def sent_back(body):
    """The items the second request carries for the first reply."""
    return body["input"][1:4]


EXPECTED = [
    REASONING,
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_fake1",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
    },
    {"type": "function_call", "call_id": "call_a", "name": "clock", "arguments": "{}", "id": "fc_fake0", "status": "completed"},
]


@asynctest
async def test_reasoning_items_are_sent_back_with_the_items_after_them():
    with FakeServer(P) as server:
        server.add(
            Reply(reasoning="Need the clock.", signature="ENC-1", text="Checking.", tool_calls=[ToolCall("call_a", "clock", "{}")]),
            Reply(text="Noon."),
        )
        model = make(P, server, store=False, reasoning={"effort": "low", "summary": "auto"})
        loop = await run(model, "time?", tools=[clock])
        first, second = (r.body for r in server.requests)
        assert first["include"] == ["reasoning.encrypted_content"] and first["store"] is False
        assert first["reasoning"] == {"effort": "low", "summary": "auto"}
        assert sent_back(second) == EXPECTED
        assert second["input"][4] == {"type": "function_call_output", "call_id": "call_a", "output": "12:00"}
        assert messages(loop.log)[0]["message"]["content"][0] == {"type": "reasoning", "text": "Need the clock."}
        await done(loop, model)


@asynctest
async def test_reasoning_items_survive_a_restart(tmp_path):
    store = kerman.FileStore(tmp_path / "sessions")
    with FakeServer(P) as server:
        server.add(
            Reply(reasoning="Need the clock.", signature="ENC-1", text="Checking.", tool_calls=[ToolCall("call_a", "clock", "{}")]),
            Reply(text="Noon."),
            Reply(text="Bye."),
        )
        model = make(P, server, store=False)
        log = store.create("s")
        loop = await run(model, "time?", tools=[clock], log=log)
        await done(loop, model)
        log.close()
        fresh = make(P, server, store=False)
        with store.open("s") as log:
            loop = await run(fresh, "thanks", log=log)
            assert sent_back(server.requests[2].body) == EXPECTED
            await done(loop, fresh)


@asynctest
async def test_a_non_streamed_reply_keeps_its_items_in_its_blocks():
    with FakeServer(P) as server:
        server.add(
            Reply(reasoning="Need the clock.", signature="ENC-1", text="Checking.", tool_calls=[ToolCall("call_a", "clock", "{}")]),
            Reply(text="Noon."),
        )
        model = make(P, server, stream=False, store=False)
        loop = await run(model, "time?", tools=[clock])
        assert messages(loop.log)[0]["message"]["content"][0]["openai"]["item"]["encrypted_content"] == "ENC-1"
        assert sent_back(server.requests[1].body) == EXPECTED
        await done(loop, model)


def ev(name, **data):
    return (name, dict(type=name, sequence_number=0, **data))


def response(status, output, **extra):
    return dict(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 1,
            "model": "m",
            "status": status,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        },
        **extra,
    )


@asynctest
async def test_summary_parts_are_one_reasoning_block_and_refusals_are_text():
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "First."}, {"type": "summary_text", "text": "Second."}],
    }
    refusal = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "refusal", "refusal": "I can't help with that."}],
    }
    stream = Raw(
        headers={"content-type": "text/event-stream"},
        body=[
            ev("response.created", response=response("in_progress", [])),
            ev("response.output_item.added", output_index=0, item=dict(reasoning, summary=[])),
            ev("response.reasoning_summary_text.delta", item_id="rs_1", output_index=0, summary_index=0, delta="First."),
            ev("response.reasoning_summary_text.delta", item_id="rs_1", output_index=0, summary_index=1, delta="Second."),
            ev("response.output_item.done", output_index=0, item=reasoning),
            ev("response.output_item.added", output_index=1, item=dict(refusal, content=[], status="in_progress")),
            ev("response.refusal.delta", item_id="msg_1", output_index=1, content_index=0, delta="I can't help with that."),
            ev("response.output_item.done", output_index=1, item=refusal),
            ev(
                "response.completed",
                response=response(
                    "completed",
                    [reasoning, refusal],
                    usage={
                        "input_tokens": 4,
                        "output_tokens": 9,
                        "total_tokens": 13,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens_details": {"reasoning_tokens": 6},
                    },
                ),
            ),
        ],
    )
    with FakeServer(P) as server:
        server.add(stream)
        model = make(P, server)
        loop = await run(model, "go")
        assert messages(loop.log)[0]["message"]["content"] == [
            {"type": "reasoning", "text": "First.\n\nSecond."},
            {"type": "text", "text": "I can't help with that."},
        ]
        assert [c for c in chunks(loop.log) if c["type"] == "usage"] == [
            {"type": "usage", "input": 4, "output": 9, "cacheRead": 0, "cacheWrite": 0, "reasoning": 6, "model": "m", "provider": "openai"}
        ]
        await done(loop, model)


@asynctest
async def test_a_failed_response_in_the_stream_is_classified():
    with FakeServer(P) as server:
        server.add(
            Reply(text=["a", "b"], error=HttpError(429, "Rate limit reached", kind="rate_limit_exceeded"), error_after=4),
            Reply(text=["a"], error=HttpError(500, "The model had an error", kind="server_error"), error_after=3),
        )
        model = make(P, server, retry=None)
        loop = await run(model, "one")
        assert failure(loop.log)["code"] == "RATE_LIMITED"
        await run(model, "two", loop=loop)
        assert failure(loop.log)["code"] == "SERVER_ERROR"
        assert [r["kind"] for r in turn_ends(loop.log)] == ["error", "error"]
        await done(loop, model)


@asynctest
async def test_an_error_event_in_the_stream_is_classified():
    stream = Raw(
        headers={"content-type": "text/event-stream"},
        body=[
            ev("response.created", response=response("in_progress", [])),
            (
                "error",
                {"type": "error", "sequence_number": 1, "code": "server_is_overloaded", "message": "Try again later.", "param": None},
            ),
        ],
    )
    with FakeServer(P) as server:
        server.add(stream)
        model = make(P, server, retry=None)
        loop = await run(model, "go")
        error = failure(loop.log)
        assert error["code"] == "OVERLOADED" and "Try again later." in error["message"]
        await done(loop, model)


@asynctest
async def test_a_reasoning_item_with_no_summary_is_sent_back_too():
    # No summary: nothing of it is visible in the message, but the item must still go back.
    with FakeServer(P) as server:
        server.add(Reply(signature="ENC-2", tool_calls=[ToolCall("call_a", "clock", "{}")]), Reply(text="Noon."))
        model = make(P, server, store=False)
        loop = await run(model, "time?", tools=[clock])
        assert messages(loop.log)[0]["message"]["content"] == [{"type": "tool-call", "id": "call_a", "name": "clock", "arguments": "{}"}]
        assert server.requests[1].body["input"][1:3] == [
            {"type": "reasoning", "id": "rs_fake1", "encrypted_content": "ENC-2", "summary": []},
            {"type": "function_call", "call_id": "call_a", "name": "clock", "arguments": "{}", "id": "fc_fake0", "status": "completed"},
        ]
        await done(loop, model)
