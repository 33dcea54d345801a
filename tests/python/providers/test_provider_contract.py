"""What every provider does, run against each of the four wire protocols through the vendor's
real SDK and a loopback FakeServer: streaming text as chunks, tool calls split across chunks and
in parallel, the usage shape, finish reasons, a stream cut or ended early, HTTP errors
classified (429 with retry-after, 5xx, context overflow, a bad key that never shows up in the
error or the log), a timeout, cancellation closing the HTTP stream with the partial text kept,
non-streaming replies, instructions, images, request options, and each history message
converted once."""

from __future__ import annotations

import asyncio
import json

import pytest
from provider_helpers import (
    KEY,
    PROTOCOLS,
    asynctest,
    chunks,
    clock,
    done,
    failure,
    make,
    messages,
    of_type,
    run,
    turn_ends,
    wait_thread_event,
)

import kerman
from kerman.providers._base import PROVIDER_IDS
from kerman.providers.testing import FakeServer, HttpError, Reply, ToolCall

pytestmark = pytest.mark.parametrize("protocol", PROTOCOLS)


@pytest.fixture
def server(protocol: str):
    with FakeServer(protocol) as s:
        yield s


def visible(log):
    return [c for c in chunks(log) if c["type"] in ("text-delta", "reasoning-delta", "tool-call")]


@asynctest
async def test_text_streams_as_text_delta_chunks(protocol, server):
    server.add(Reply(text=["Hel", "lo", " world"]))
    model = make(protocol, server)
    loop = await run(model, "hi")
    assert visible(loop.log) == [{"type": "text-delta", "text": t} for t in ("Hel", "lo", " world")]
    [message] = messages(loop.log)
    assert message["message"]["content"] == [{"type": "text", "text": "Hello world"}]
    assert chunks(loop.log)[-1]["type"] == "finish" and chunks(loop.log)[-1]["reason"] == "stop"
    assert turn_ends(loop.log) == [{"kind": "completed"}]
    assert len(server.requests) == 1 and server.requests[0].stream
    await done(loop, model)


@asynctest
async def test_parallel_tool_calls_split_across_chunks_become_one_chunk_each(protocol, server):
    server.add(
        Reply(
            text="Checking.",
            tool_calls=[
                ToolCall("call_1", "clock", '{"tz": "UTC", "fmt": "24h"}', pieces=4),
                ToolCall("call_2", "clock", '{"tz": "CET"}', pieces=3),
            ],
        ),
        Reply(text="It is 12:00."),
    )
    model = make(protocol, server)
    loop = await run(model, "time?", tools=[clock])
    calls = [c for c in chunks(loop.log) if c["type"] == "tool-call"]
    assert calls == [
        {
            "type": "tool-call",
            "id": "call_1",
            "name": "clock",
            "arguments": json.dumps({"tz": "UTC", "fmt": "24h"}) if protocol != "gemini" else '{"tz":"UTC","fmt":"24h"}',
        },
        {
            "type": "tool-call",
            "id": "call_2",
            "name": "clock",
            "arguments": json.dumps({"tz": "CET"}) if protocol != "gemini" else '{"tz":"CET"}',
        },
    ]
    assert [e.data["callId"] for e in of_type(loop.log, "tool/call")] == ["call_1", "call_2"]
    assert [e.data["message"]["content"][0]["toolCallId"] for e in of_type(loop.log, "tool/result")] == ["call_1", "call_2"]
    assert messages(loop.log)[-1]["message"]["content"] == [{"type": "text", "text": "It is 12:00."}]
    assert turn_ends(loop.log) == [{"kind": "completed"}] and len(server.requests) == 2
    await done(loop, model)


@asynctest
async def test_usage_has_one_shape_for_every_provider(protocol, server):
    server.add(Reply(text="ok", usage={"input": 100, "output": 30, "cacheRead": 40, "cacheWrite": 10, "reasoning": 5}))
    model = make(protocol, server)
    loop = await run(model, "hi")
    [usage] = [c for c in chunks(loop.log) if c["type"] == "usage"]
    expected = {"type": "usage", "input": 100, "output": 30, "cacheRead": 40, "cacheWrite": 10, "reasoning": 5}
    # Which model answered (as the server names it) and the provider, for the ledger's prices.
    expected.update(model="fake-model", provider=PROVIDER_IDS[protocol])
    if protocol == "gemini":
        expected["cacheWrite"] = 0  # Gemini reports no cache writes
    assert usage == expected
    assert messages(loop.log)[0]["usage"] == {k: v for k, v in expected.items() if k != "type"}
    await done(loop, model)


@asynctest
async def test_a_reply_cut_by_max_tokens_ends_the_turn_max_tokens(protocol, server):
    server.add(Reply(text="partial", finish="max-tokens"))
    model = make(protocol, server)
    loop = await run(model, "hi")
    assert chunks(loop.log)[-1]["reason"] == "max-tokens"
    assert turn_ends(loop.log) == [{"kind": "max-tokens"}]
    await done(loop, model)


@asynctest
async def test_a_stream_cut_mid_way_is_a_stream_interrupted_failure(protocol, server):
    server.add(Reply(text=["a", "b", "c"], cut_after_text=1))
    model = make(protocol, server, retry=None)
    loop = await run(model, "hi")
    error = failure(loop.log)
    assert error["code"] == "STREAM_INTERRUPTED" and error["exceptionType"] == "ModelConnectionError"
    assert visible(loop.log) == [{"type": "text-delta", "text": "a"}]  # the failed attempt's chunks stay
    assert messages(loop.log) == []
    await done(loop, model)


@asynctest
async def test_a_stream_that_ends_before_its_end_event_is_interrupted_too(protocol, server):
    server.add(Reply(text=["a", "b", "c"], end_after=1))
    model = make(protocol, server, retry=None)
    loop = await run(model, "hi")
    assert failure(loop.log)["code"] == "STREAM_INTERRUPTED"
    assert messages(loop.log) == []
    await done(loop, model)


@pytest.mark.parametrize(
    "headers, ms",
    [({"retry-after": "7"}, 7000), ({"retry-after-ms": "1500", "retry-after": "2"}, 1500)],
    ids=["retry-after", "retry-after-ms"],
)
@asynctest
async def test_429_is_a_rate_limit_error_with_retry_after(protocol, server, headers, ms):
    server.add(HttpError(429, "Rate limit reached for requests", headers=headers))
    model = make(protocol, server, retry=None)
    loop = await run(model, "hi")
    error = failure(loop.log)
    assert (error["code"], error["status"], error["retryAfterMs"], error["exceptionType"]) == ("RATE_LIMITED", 429, ms, "RateLimitError")
    assert error["requestId"] == "req_fake_1"
    assert "Rate limit reached" in error["message"] and error["message"].startswith(protocol)
    assert isinstance(loop.last_error.exception, kerman.errors.RateLimitError)
    await done(loop, model)


@pytest.mark.parametrize(
    "status, code, cls",
    [(500, "SERVER_ERROR", "ServerError"), (503, "OVERLOADED", "OverloadedError"), (529, "OVERLOADED", "OverloadedError")],
)
@asynctest
async def test_server_errors_are_classified(protocol, server, status, code, cls):
    server.add(HttpError(status, "the server had an error"))
    model = make(protocol, server, retry=None)
    loop = await run(model, "hi")
    error = failure(loop.log)
    assert (error["code"], error["status"], error["exceptionType"]) == (code, status, cls)
    await done(loop, model)


CONTEXT = {
    "openai-chat": HttpError(
        400,
        "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.",
        kind="context_length_exceeded",
    ),
    "openai-responses": HttpError(400, "Your input exceeds the context window of this model.", kind="context_length_exceeded"),
    "anthropic": HttpError(400, "prompt is too long: 210000 tokens > 200000 maximum"),
    "gemini": HttpError(400, "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."),
}


@asynctest
async def test_a_context_overflow_is_a_context_length_error(protocol, server):
    server.add(CONTEXT[protocol])
    model = make(protocol, server)
    loop = await run(model, "hi")
    error = failure(loop.log)
    assert (error["code"], error["status"], error["exceptionType"]) == ("CONTEXT_LENGTH_EXCEEDED", 400, "ContextLengthError")
    await done(loop, model)


@asynctest
async def test_a_bad_request_is_an_invalid_request_error(protocol, server):
    server.add(HttpError(400, "messages: field required"))
    model = make(protocol, server)
    loop = await run(model, "hi")
    assert failure(loop.log)["code"] == "BAD_REQUEST"
    assert loop.last_error.exception.__class__.__name__ == "InvalidRequestError"
    await done(loop, model)


@asynctest
async def test_a_bad_key_fails_without_showing_the_key(protocol):
    with FakeServer(protocol, api_key="the-right-key") as server:
        model = make(protocol, server)  # sends KEY, which the server quotes back in its error body
        loop = await run(model, "hi")
        error = failure(loop.log)
        assert error["code"] == "AUTHENTICATION_FAILED" and error["exceptionType"] == "AuthenticationError"
        assert KEY in server.requests[0].raw.decode() or KEY in json.dumps(server.requests[0].headers)  # it was sent
        everything = json.dumps([e.to_dict() for e in loop.log.events()])
        assert KEY not in everything and KEY not in str(loop.last_error.exception)
        assert KEY not in loop.last_error.traceback and KEY not in repr(model)
        assert "***" in error["message"]
        await done(loop, model)


@asynctest
async def test_a_client_timeout_is_a_model_timeout_error(protocol, server):
    server.add(Reply(text="never sent", hold_after=0))
    model = make(protocol, server, retry=None, timeout=0.5)  # the server sends headers, then nothing
    loop = await run(model, "hi")
    assert failure(loop.log)["code"] == "TIMEOUT"
    assert loop.last_error.exception.__class__.__name__ == "ModelTimeoutError"
    await done(loop, model)


@asynctest
async def test_cancelling_mid_stream_closes_the_connection_and_keeps_the_partial_text(protocol, server):
    server.add(Reply(text=["Hel", "lo", " never"], hold_after_text=2))
    model = make(protocol, server)
    loop = kerman.AgentLoop(model)
    two = asyncio.Event()
    loop.log.subscribe(lambda e: two.set() if sum(c["type"] == "text-delta" for c in chunks(loop.log)) >= 2 else None)
    loop.followup("hi")
    await asyncio.wait_for(two.wait(), 10)  # both deltas are logged while the stream is still open
    assert not server.disconnected.is_set()
    loop.cancel()
    await loop.when_idle()
    assert await wait_thread_event(server.disconnected), "the server never saw the connection close"
    [message] = messages(loop.log)
    assert message.get("interrupted") is True
    assert message["message"]["content"] == [{"type": "text", "text": "Hello"}]
    assert turn_ends(loop.log) == [{"kind": "aborted", "reason": {"kind": "user"}}]
    await done(loop, model)


@asynctest
async def test_a_non_streaming_provider_replies_in_one_piece(protocol, server):
    server.add(
        Reply(
            text="Checking.",
            tool_calls=[ToolCall("call_1", "clock", "{}")],
            usage={"input": 20, "output": 4, "cacheRead": 0, "cacheWrite": 0, "reasoning": 0},
        ),
        Reply(text="Noon."),
    )
    model = make(protocol, server, stream=False)
    loop = await run(model, "time?", tools=[clock])
    assert chunks(loop.log) == []
    assert not any(r.stream for r in server.requests)
    first, second = messages(loop.log)
    assert first["message"]["content"] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool-call", "id": "call_1", "name": "clock", "arguments": "{}"},
    ]
    assert first["usage"] == {
        "input": 20,
        "output": 4,
        "cacheRead": 0,
        "cacheWrite": 0,
        "reasoning": 0,
        "model": "fake-model",
        "provider": PROVIDER_IDS[protocol],
    }
    assert second["message"]["content"] == [{"type": "text", "text": "Noon."}]
    await done(loop, model)


def system_of(protocol, body):
    if protocol == "openai-chat":
        first = body["messages"][0]
        return first["content"] if first["role"] == "system" else None
    if protocol == "openai-responses":
        return body.get("instructions")
    if protocol == "anthropic":
        return body.get("system")
    return (body.get("systemInstruction") or {"parts": [{}]})["parts"][0].get("text")


@asynctest
async def test_instructions_from_the_constructor_and_from_the_request(protocol, server):
    server.add(Reply(text="a"), Reply(text="b"), Reply(text="c"))
    model = make(protocol, server, instructions="Be brief.")
    loop = await run(model, "one")
    steer = {"text": "Answer in French."}

    @loop.before_request
    async def instruct(request, next):
        if steer["text"] is not None:
            request.instructions = steer["text"]  # what ModelRequest.instructions will carry
        return await next()

    await run(model, "two", loop=loop)
    steer["text"] = None
    await run(model, "three", loop=loop)
    assert [system_of(protocol, r.body) for r in server.requests] == ["Be brief.", "Answer in French.", "Be brief."]
    await done(loop, model)


@asynctest
async def test_no_instructions_send_no_system_field(protocol, server):
    server.add(Reply(text="a"))
    model = make(protocol, server)
    loop = await run(model, "one")
    assert system_of(protocol, server.requests[0].body) is None
    await done(loop, model)


PNG = "iVBORw0KGgo="


def image_of(protocol, body):
    """The image of the first user message, as the body carries it."""
    if protocol == "openai-chat":
        return [p for p in body["messages"][0]["content"] if p["type"] == "image_url"]
    if protocol == "openai-responses":
        return [p for p in body["input"][0]["content"] if p["type"] == "input_image"]
    if protocol == "anthropic":
        return [p for p in body["messages"][0]["content"] if p["type"] == "image"]
    return [camel(p) for p in body["contents"][0]["parts"] if "inlineData" in p or "inline_data" in p]


def camel(value):
    """Google's JSON takes field names in either case, and the SDK sends some snake_case ones."""
    if isinstance(value, dict):
        return {k.split("_")[0] + "".join(w.title() for w in k.split("_")[1:]): camel(v) for k, v in value.items()}
    return value


IMAGES = {
    "openai-chat": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}],
    "openai-responses": [{"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"}],
    "anthropic": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}],
    "gemini": [{"inlineData": {"mimeType": "image/png", "data": PNG}}],
}


@asynctest
async def test_images_in_user_content(protocol, server):
    server.add(Reply(text="A square."))
    model = make(protocol, server)
    loop = await run(
        model, kerman.UserMessage([{"type": "text", "text": "What is this?"}, {"type": "image", "mediaType": "image/png", "data": PNG}])
    )
    assert image_of(protocol, server.requests[0].body) == IMAGES[protocol]
    await done(loop, model)


OPTIONS = {
    "openai-chat": ({"temperature": 0.25}, lambda b: b["temperature"]),
    "openai-responses": ({"temperature": 0.25}, lambda b: b["temperature"]),
    "anthropic": ({"stop_sequences": ["END"]}, lambda b: b["stop_sequences"]),
    "gemini": ({"temperature": 0.25}, lambda b: b["generationConfig"]["temperature"]),
}


@asynctest
async def test_request_options_go_to_the_sdk_call(protocol, server):
    options, read = OPTIONS[protocol]
    server.add(Reply(text="a"))
    model = make(protocol, server)
    loop = kerman.AgentLoop(model, options=options)
    await run(model, "hi", loop=loop)
    assert read(server.requests[0].body) == next(iter(options.values()))
    await done(loop, model)


@asynctest
async def test_each_history_message_is_converted_once(protocol, server):
    server.add(
        Reply(text="Checking.", tool_calls=[ToolCall("call_1", "clock", "{}"), ToolCall("call_2", "clock", "{}")]),
        Reply(text="Noon."),
        Reply(text="Bye."),
    )
    model = make(protocol, server)
    converted = []
    original = model._convert

    def counting(message, blocks, request):
        converted.append(message.id)
        return original(message, blocks, request)

    model._convert = counting
    loop = await run(model, "time?", "thanks", tools=[clock])
    assert len(server.requests) == 3
    history = [e for e in loop.log.events() if e.type in ("user/message", "assistant/message", "tool/result")]
    assert len(history) == 7  # user, assistant, 2 results, assistant, user, assistant
    # every message that reached a request was converted exactly once (the last reply never did)
    assert sorted(converted) == sorted(set(converted)) and len(converted) == 6
    await done(loop, model)


@asynctest
async def test_the_sdk_does_not_retry_by_itself(protocol, server):
    # The client a provider builds has the SDK's retries off: the request_error seam decides.
    server.add(HttpError(500, "boom"), Reply(text="a retry would have got this"))
    model = make(protocol, server, retry=None)
    loop = await run(model, "hi")
    assert failure(loop.log)["code"] == "SERVER_ERROR"
    assert len(server.requests) == 1 and server.pending == 1
    await done(loop, model)


@asynctest
async def test_a_tool_result_that_is_an_error_reaches_the_model(protocol, server):
    server.add(Reply(tool_calls=[ToolCall("call_1", "broken", "{}")]), Reply(text="Sorry."))
    model = make(protocol, server)

    async def broken(args, ctx):
        """Fails."""
        raise RuntimeError("disk on fire")

    loop = await run(model, "go", tools=[broken])
    body = json.dumps(server.requests[1].body)
    assert "disk on fire" in body
    assert turn_ends(loop.log) == [{"kind": "completed"}]
    await done(loop, model)


@asynctest
async def test_a_history_trimmed_by_a_listener_is_sent_trimmed(protocol, server):
    # The wire list of the previous request is reused only when this request extends it.
    server.add(Reply(text="one"), Reply(text="two"), Reply(text="three"))
    model = make(protocol, server)
    loop = await run(model, "first", "second")
    keep = {"last": None}

    @loop.before_request
    async def trim(request, next):
        if keep["last"] is not None:
            request.messages = request.messages[-keep["last"] :]
        return await next()

    keep["last"] = 1
    await run(model, "third", loop=loop)
    body = json.dumps(server.requests[2].body)
    assert "third" in body and "first" not in body and "second" not in body and "one" not in body
    body = json.dumps(server.requests[1].body)
    assert "first" in body and "one" in body and "second" in body
    await done(loop, model)


def assistant_entries(protocol, body):
    if protocol == "openai-chat":
        return [m for m in body["messages"] if m["role"] == "assistant"]
    if protocol == "openai-responses":
        return [i for i in body["input"] if i.get("role") == "assistant" or i.get("type") in ("reasoning", "function_call")]
    if protocol == "anthropic":
        return [m for m in body["messages"] if m["role"] == "assistant"]
    return [c for c in body["contents"] if c["role"] == "model"]


@asynctest
async def test_a_reply_of_unsigned_reasoning_alone_is_left_out(protocol, server):
    # What a cancelled stream leaves when it had only thought so far, or another model's
    # reasoning: no vendor takes an assistant turn made of that.
    log = kerman.MemoryStore().create()
    earlier = kerman.models.ScriptedModel([[{"type": "reasoning-delta", "text": "hidden thoughts"}]])
    loop = await run(earlier, "hello", log=log)
    await loop.aclose()
    server.add(Reply(text="Hi."))
    model = make(protocol, server)
    loop = await run(model, "again", log=log)
    body = server.requests[0].body
    assert assistant_entries(protocol, body) == [] and "hidden thoughts" not in json.dumps(body)
    assert "hello" in json.dumps(body) and "again" in json.dumps(body)
    await done(loop, model)


@asynctest
async def test_cancelling_before_the_response_starts_closes_the_connection(protocol, server):
    server.add(Reply(text="never", hold_headers=True))
    model = make(protocol, server)
    loop = kerman.AgentLoop(model)
    loop.followup("hi")
    assert await wait_thread_event(server.received), "the request never reached the server"
    loop.cancel()
    await loop.when_idle()
    assert await wait_thread_event(server.disconnected), "the server never saw the connection close"
    assert messages(loop.log) == [] and turn_ends(loop.log) == [{"kind": "aborted", "reason": {"kind": "user"}}]
    await done(loop, model)


@asynctest
async def test_errors_of_a_non_streaming_request_are_classified_the_same(protocol, server):
    server.add(HttpError(429, "Rate limit reached", headers={"retry-after": "4"}), CONTEXT[protocol])
    model = make(protocol, server, retry=None, stream=False)
    loop = await run(model, "one")
    error = failure(loop.log)
    assert (error["code"], error["status"], error["retryAfterMs"]) == ("RATE_LIMITED", 429, 4000)
    await run(model, "two", loop=loop)
    assert failure(loop.log)["code"] == "CONTEXT_LENGTH_EXCEEDED"
    await done(loop, model)
