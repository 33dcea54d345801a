"""Providers retry by default (rate limits, overloads, 5xx, timeouts, cut streams) with the
documented ``retry_policy()``; ``retry=`` changes or removes it in one line, and a policy the
loop has of its own decides instead. Then the total ``deadline=`` of a request, against a
server that sends keep-alives forever."""

from __future__ import annotations

import asyncio

import pytest
from provider_helpers import PROTOCOLS, TIMEOUT, asynctest, done, failure, make, messages, run, turn_ends

import kerman
from kerman.providers import Fallback, retry_policy
from kerman.providers.testing import FakeServer, HttpError, Raw, Reply

NOW = {"retry-after": "0"}  # the server says: retry at once (the default policy waits exactly that)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@asynctest
async def test_a_rate_limit_an_overload_and_a_server_error_are_retried_by_default(protocol):
    with FakeServer(protocol) as server:
        server.add(
            HttpError(429, "Slow down", headers=NOW),
            HttpError(503, "Overloaded", headers=NOW),
            HttpError(500, "Oops", headers=NOW),
            Reply(text="Hello!"),
        )
        model = make(protocol, server)
        loop = await run(model, "Hi")
        assert turn_ends(loop.log)[-1]["kind"] == "completed"
        assert messages(loop.log)[-1]["message"]["content"] == [{"type": "text", "text": "Hello!"}]
        assert len(server.requests) == 4
        await done(loop, model)


@asynctest
async def test_the_default_policy_gives_up_after_four_requests():
    with FakeServer("openai-chat") as server:
        for _ in range(5):
            server.add(HttpError(429, "Slow down", headers=NOW))
        model = make("openai-chat", server)
        loop = await run(model, "Hi")
        assert failure(loop.log)["code"] == "RATE_LIMITED" and len(server.requests) == 4
        await done(loop, model)


@asynctest
async def test_retry_none_ends_the_turn_at_the_first_failure():
    with FakeServer("anthropic") as server:
        server.add(HttpError(529, "Overloaded", headers=NOW), Reply(text="never"))
        model = make("anthropic", server, retry=None)
        loop = await run(model, "Hi")
        assert failure(loop.log)["code"] == "OVERLOADED" and len(server.requests) == 1
        await done(loop, model)


@asynctest
async def test_a_cut_stream_is_retried_with_the_policys_backoff():
    waits = []

    async def sleep(seconds):  # the policy's wait, recorded instead of slept
        waits.append(seconds)

    with FakeServer("openai-chat") as server:
        server.add(Reply(text=["Hel", "lo"], cut_after=1), Reply(text="Hello!"))
        model = make("openai-chat", server, retry=retry_policy(base_delay=0.5, jitter=0, sleep=sleep))
        loop = await run(model, "Hi")
        assert turn_ends(loop.log)[-1]["kind"] == "completed" and waits == [0.5]
        assert messages(loop.log)[-1]["message"]["content"] == [{"type": "text", "text": "Hello!"}]
        await done(loop, model)


@asynctest
async def test_a_policy_the_loop_has_decides_instead_of_the_providers():
    with FakeServer("openai-chat") as server:
        for _ in range(3):
            server.add(HttpError(429, "Slow down", headers=NOW))
        model = make("openai-chat", server)
        loop = kerman.AgentLoop(model)
        loop.request_error(retry_policy(max_attempts=2))
        await run(model, "Hi", loop=loop)
        assert failure(loop.log)["code"] == "RATE_LIMITED" and len(server.requests) == 2
        await done(loop, model)


@asynctest
async def test_one_default_policy_per_loop_for_the_models_of_a_fallback():
    with FakeServer("openai-chat") as first, FakeServer("anthropic") as second:
        first.add(Reply(text=["a", "b"], cut_after_text=1), Reply(text="from the first"))
        second.add(Reply(text="never"))
        models = [make("openai-chat", first), make("anthropic", second)]
        loop = await run(Fallback(models), "Hi")
        # The cut came after output: raised as it is, retried once by the (single) default policy.
        assert messages(loop.log)[-1]["message"]["content"] == [{"type": "text", "text": "from the first"}]
        assert len(first.requests) == 2 and len(second.requests) == 0
        assert len(loop._request_error) == 1
        await done(loop)


def keep_alives(protocol, server):
    """A stream that starts and then only keeps the connection alive, until the client leaves
    (bounded: the test would fail long before the last one)."""
    if protocol == "anthropic":
        first = (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                },
            },
        )
        beat = b'event: ping\ndata: {"type": "ping"}\n\n'
    elif protocol == "gemini":  # no comments in Gemini's streams: an empty part each time
        first = b'data: {"candidates": [{"content": {"parts": [{"text": "Thinking"}], "role": "model"}}]}\n\n'
        beat = b'data: {"candidates": [{"content": {"parts": [{"text": ""}], "role": "model"}}]}\n\n'
    elif protocol == "openai-responses":
        first = (
            "response.created",
            {
                "type": "response.created",
                "sequence_number": 0,
                "response": {
                    "id": "resp_1",
                    "object": "response",
                    "created_at": 1,
                    "model": "m",
                    "status": "in_progress",
                    "output": [],
                    "parallel_tool_calls": True,
                    "tool_choice": "auto",
                    "tools": [],
                },
            },
        )
        beat = b": keep-alive\n\n"
    else:
        first = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "Thinking"}, "finish_reason": None}],
        }
        beat = b": keep-alive\n\n"

    def body():
        yield first
        for _ in range(int(TIMEOUT / 0.02) * 3):  # well past the test's bound
            if server.disconnected.wait(0.02):  # the pace of the keep-alives; ends when the client left
                return
            yield beat

    return Raw(headers={"content-type": "text/event-stream"}, body=body())


@pytest.mark.parametrize("protocol", PROTOCOLS)
@asynctest
async def test_a_deadline_ends_a_request_the_server_keeps_alive_forever(protocol):
    with FakeServer(protocol) as server:
        server.add(keep_alives(protocol, server))
        model = make(protocol, server, retry=None, deadline=0.5)
        loop = kerman.AgentLoop(model)
        loop.followup("Hi")
        await asyncio.wait_for(loop.when_idle(), TIMEOUT)
        error = failure(loop.log)
        assert error["code"] == "TIMEOUT", error
        assert error["message"] == f"{protocol}: no complete reply within the deadline of 0.5 s"
        assert await asyncio.to_thread(server.disconnected.wait, TIMEOUT)  # the connection was closed
        await done(loop, model)


@asynctest
async def test_a_deadline_bounds_a_non_streamed_request_and_is_retried_as_a_timeout():
    with FakeServer("openai-chat") as server:
        server.add(Reply(text="late", hold_headers=True), Reply(text="on time"))
        model = make("openai-chat", server, stream=False, deadline=0.5, retry=retry_policy(base_delay=0, jitter=0))
        loop = kerman.AgentLoop(model)
        loop.followup("Hi")
        await asyncio.wait_for(loop.when_idle(), TIMEOUT)
        assert messages(loop.log)[-1]["message"]["content"] == [{"type": "text", "text": "on time"}]
        assert len(server.requests) == 2
        await done(loop, model)


def test_retry_and_deadline_arguments_are_checked():
    from kerman.providers import OpenAIChat

    with pytest.raises(ValueError, match=r"deadline must be a finite number of seconds > 0 or None, got -1"):
        OpenAIChat("m", api_key="k", base_url="http://127.0.0.1:9", deadline=-1)
    with pytest.raises(TypeError, match=r"retry must be a request_error listener \(retry_policy\(...\)\) or None, got 3"):
        OpenAIChat("m", api_key="k", base_url="http://127.0.0.1:9", retry=3)
