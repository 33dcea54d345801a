"""``retry_policy`` (a ``request_error`` listener) and ``Fallback`` (a model over a list of
models), end to end through the loop and the real SDKs. The policy's waits go through an
injected ``sleep`` that records them, so nothing here sleeps."""

from __future__ import annotations

import asyncio

import pytest
from provider_helpers import asynctest, chunks, done, failure, make, messages, run, turn_ends

import kerman
from kerman.providers import FALLBACK_ON, RETRY_ON, Fallback, retry_policy, should_retry
from kerman.providers.testing import FakeServer, HttpError, Reply

P = "openai-chat"


class Sleeps:
    def __init__(self):
        self.waited = []

    async def __call__(self, seconds):
        self.waited.append(seconds)


async def with_policy(model, *prompts, **policy):
    sleeps = Sleeps()
    loop = kerman.AgentLoop(model)
    loop.request_error(retry_policy(sleep=sleeps, **policy))
    await run(model, *prompts, loop=loop)
    return loop, sleeps


@asynctest
async def test_a_429_is_retried_after_its_retry_after():
    with FakeServer(P) as server:
        server.add(HttpError(429, "slow down", headers={"retry-after": "3"}), Reply(text="ok"))
        model = make(P, server)
        loop, sleeps = await with_policy(model, "hi")
        assert sleeps.waited == [3.0]
        assert turn_ends(loop.log) == [{"kind": "completed"}] and len(server.requests) == 2
        assert messages(loop.log)[0]["message"]["content"] == [{"type": "text", "text": "ok"}]
        await done(loop, model)


@asynctest
async def test_server_errors_back_off_exponentially_and_the_attempts_are_bounded():
    with FakeServer(P) as server:
        server.add(*[HttpError(500, "boom")] * 5)
        model = make(P, server)
        loop, sleeps = await with_policy(model, "hi", max_attempts=4, base_delay=0.5, jitter=0)
        assert sleeps.waited == [0.5, 1.0, 2.0]
        assert len(server.requests) == 4 and server.pending == 1
        assert failure(loop.log)["code"] == "SERVER_ERROR"
        await done(loop, model)


@asynctest
async def test_the_backoff_is_capped_and_jittered_below_its_step():
    with FakeServer(P) as server:
        server.add(*[HttpError(503, "busy")] * 6)
        model = make(P, server)
        loop, sleeps = await with_policy(model, "hi", max_attempts=6, base_delay=1.0, max_delay=3.0, jitter=0.5)
        steps = [1.0, 2.0, 3.0, 3.0, 3.0]
        assert len(sleeps.waited) == 5
        assert all(step / 2 <= w <= step for w, step in zip(sleeps.waited, steps, strict=True))
        await done(loop, model)


@pytest.mark.parametrize(
    "error",
    [
        HttpError(401, "bad key"),
        HttpError(400, "bad request"),
        HttpError(400, "maximum context length exceeded", kind="context_length_exceeded"),
        HttpError(429, "quota", kind="insufficient_quota"),
        HttpError(404, "no such model"),
    ],
    ids=["auth", "bad-request", "context", "quota", "not-found"],
)
@asynctest
async def test_failures_that_waiting_cannot_fix_are_not_retried(error):
    with FakeServer(P) as server:
        server.add(error, Reply(text="never"))
        model = make(P, server)
        loop, sleeps = await with_policy(model, "hi")
        assert sleeps.waited == [] and len(server.requests) == 1
        assert turn_ends(loop.log)[0]["kind"] == "error"
        await done(loop, model)


@asynctest
async def test_a_retry_after_longer_than_the_limit_is_not_waited_for():
    with FakeServer(P) as server:
        server.add(HttpError(429, "come back tomorrow", headers={"retry-after": "86400"}), Reply(text="never"))
        model = make(P, server)
        loop, sleeps = await with_policy(model, "hi", max_retry_after=60)
        assert sleeps.waited == [] and len(server.requests) == 1
        assert failure(loop.log)["retryAfterMs"] == 86_400_000
        await done(loop, model)


@asynctest
async def test_a_cut_stream_is_retried_and_the_failed_attempts_chunks_stay_logged():
    with FakeServer(P) as server:
        server.add(Reply(text=["par", "tial"], cut_after_text=1), Reply(text="whole"))
        model = make(P, server)
        loop, sleeps = await with_policy(model, "hi", jitter=0)
        assert sleeps.waited == [0.5]
        assert [c["text"] for c in chunks(loop.log) if c["type"] == "text-delta"] == ["par", "whole"]
        assert [m["message"]["content"] for m in messages(loop.log)] == [[{"type": "text", "text": "whole"}]]
        await done(loop, model)


@asynctest
async def test_the_count_is_per_step():
    with FakeServer(P) as server:
        server.add(HttpError(500, "a"), HttpError(500, "b"), Reply(text="one"), HttpError(500, "c"), HttpError(500, "d"), Reply(text="two"))
        model = make(P, server)
        loop, sleeps = await with_policy(model, "first", "second", max_attempts=3, jitter=0)
        assert sleeps.waited == [0.5, 1.0, 0.5, 1.0]
        assert turn_ends(loop.log) == [{"kind": "completed"}, {"kind": "completed"}]
        await done(loop, model)


@asynctest
async def test_a_later_listener_decides_first():
    with FakeServer(P) as server:
        server.add(HttpError(500, "a"), Reply(text="ok"))
        model = make(P, server)
        sleeps = Sleeps()
        loop = kerman.AgentLoop(model)
        loop.request_error(retry_policy(sleep=sleeps))
        decided = []

        @loop.request_error
        async def mine(failure, next):
            decided.append(failure.failure["code"])
            return kerman.Retry()

        await run(model, "hi", loop=loop)
        assert decided == ["SERVER_ERROR"] and sleeps.waited == []
        assert turn_ends(loop.log) == [{"kind": "completed"}]
        await done(loop, model)


@asynctest
async def test_cancelling_during_the_backoff_ends_the_turn():
    with FakeServer(P) as server:
        server.add(HttpError(500, "a"))
        model = make(P, server)
        loop = kerman.AgentLoop(model)
        waiting = asyncio.Event()

        async def forever(seconds):
            waiting.set()
            await asyncio.Event().wait()

        loop.request_error(retry_policy(sleep=forever))
        loop.followup("hi")
        await asyncio.wait_for(waiting.wait(), 10)
        loop.cancel()
        await loop.when_idle()
        assert turn_ends(loop.log) == [{"kind": "aborted", "reason": {"kind": "user"}}]
        await done(loop, model)


def test_the_retryable_codes():
    assert should_retry({"code": "RATE_LIMITED"}) and should_retry({"code": "STREAM_INTERRUPTED"})
    assert not should_retry({"code": "AUTHENTICATION_FAILED"}) and not should_retry({"code": "UNKNOWN"})
    assert {"QUOTA_EXCEEDED", "CONTEXT_LENGTH_EXCEEDED"} <= FALLBACK_ON and not ({"QUOTA_EXCEEDED"} & RETRY_ON)
    with pytest.raises(ValueError):
        retry_policy(max_attempts=0)


# -- Fallback ----------------------------------------------------------------------------------


@asynctest
async def test_fallback_moves_on_when_the_first_model_is_overloaded():
    with FakeServer("openai-chat") as first, FakeServer("anthropic") as second:
        first.add(HttpError(503, "overloaded"))
        second.add(Reply(text="from the second"))
        a, b = make("openai-chat", first), make("anthropic", second)
        model = Fallback([a, b])
        loop = await run(model, "hi")
        assert messages(loop.log)[0]["message"]["content"] == [{"type": "text", "text": "from the second"}]
        assert len(first.requests) == 1 and len(second.requests) == 1
        assert repr(model).startswith("Fallback([OpenAIChat(")
        await done(loop)


@asynctest
async def test_fallback_does_not_move_on_for_a_bad_key():
    with FakeServer(P) as first, FakeServer(P) as second:
        first.add(HttpError(401, "bad key"))
        second.add(Reply(text="never"))
        model = Fallback([make(P, first), make(P, second)])
        loop = await run(model, "hi")
        assert failure(loop.log)["code"] == "AUTHENTICATION_FAILED" and second.requests == []
        await done(loop)


@asynctest
async def test_fallback_does_not_mix_two_models_in_one_reply():
    with FakeServer(P) as first, FakeServer(P) as second:
        first.add(Reply(text=["half", "way"], cut_after_text=1))
        second.add(Reply(text="never"))
        model = Fallback([make(P, first, retry=None), make(P, second, retry=None)])
        loop = await run(model, "hi")
        assert failure(loop.log)["code"] == "STREAM_INTERRUPTED" and second.requests == []
        await done(loop)


@asynctest
async def test_fallback_raises_the_last_failure_with_the_earlier_ones():
    with FakeServer(P) as first, FakeServer(P) as second:
        first.add(HttpError(500, "first down"))
        second.add(HttpError(429, "second busy", headers={"retry-after": "2"}))
        model = Fallback([make(P, first, retry=None), make(P, second, retry=None)])
        loop = await run(model, "hi")
        error = failure(loop.log)
        assert (error["code"], error["retryAfterMs"]) == ("RATE_LIMITED", 2000)
        earlier = loop.last_error.exception.fallback_errors
        assert [e.code for e in earlier] == ["SERVER_ERROR"]
        await done(loop)


@asynctest
async def test_fallback_with_a_retry_policy_starts_again_from_the_first_model():
    with FakeServer(P) as first, FakeServer(P) as second:
        first.add(HttpError(429, "busy", headers={"retry-after": "1"}), Reply(text="first again"))
        second.add(HttpError(503, "down"))
        model = Fallback([make(P, first), make(P, second)])
        loop, sleeps = await with_policy(model, "hi", jitter=0)
        assert sleeps.waited == [0.5]  # the failure raised is the last one (503, no retry-after): backoff
        assert len(first.requests) == 2 and len(second.requests) == 1
        assert messages(loop.log)[0]["message"]["content"] == [{"type": "text", "text": "first again"}]
        await done(loop)


@asynctest
async def test_fallback_of_non_streaming_models():
    with FakeServer(P) as first, FakeServer("gemini") as second:
        first.add(HttpError(500, "down"))
        second.add(Reply(text="from gemini"))
        model = Fallback([make(P, first, stream=False), make("gemini", second, stream=False)])
        loop = await run(model, "hi")
        # The first model's failure is in the log as a request of its own, before the reply.
        assert [(c["type"], c["reason"], c["error"]["code"]) for c in chunks(loop.log)] == [("finish", "error", "SERVER_ERROR")]
        assert messages(loop.log)[0]["message"]["content"] == [{"type": "text", "text": "from gemini"}]
        await done(loop)


def test_fallback_needs_models():
    with pytest.raises(ValueError):
        Fallback([])
    with pytest.raises(TypeError):
        Fallback(["not a model"])
