"""Requests the log used to miss: one cancelled before its first chunk (the loop's ``finish``
chunk of reason ``cancelled``), and each inner attempt of a ``Fallback`` (the failed ``finish``
it yields, naming the model that failed). Each is counted once, with its
model, by the ledger and by the budget, also after a restart."""

from __future__ import annotations

import asyncio
import os
import sys
from decimal import Decimal
from typing import Any, AsyncIterator, Callable, Dict, List

import pytest

import kerman
from kerman import AgentLoop, ModelError, ModelReply, RunError
from kerman.cli._timeline import format_event
from kerman.usage import ledger

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "providers"))

from provider_helpers import asynctest, make  # noqa: E402

from kerman.providers import Fallback, retry_policy  # noqa: E402
from kerman.providers.testing import FakeServer, HttpError, Reply  # noqa: E402

USAGE = {"input": 100, "output": 10}


class Turns:
    """A model whose n-th call behaves as ``behaviours[n]``: ``"hang-stream"`` (a stream that
    never yields), ``"hang-after-usage"`` (yields usage and text, then never more), ``"hang"``
    (a reply never returned), ``"fail"`` (raises before anything), ``"ok"``. ``reached`` is
    set when the call has got as far as it will."""

    def __init__(self, *behaviours: str) -> None:
        self.behaviours = list(behaviours)
        self.calls = 0
        self.reached = asyncio.Event()

    def __call__(self, request: kerman.ModelRequest) -> Any:
        behaviour = self.behaviours[self.calls]
        self.calls += 1
        if behaviour.startswith("hang-"):
            return self._stream(behaviour)
        return self._reply(behaviour)

    async def _stream(self, behaviour: str) -> AsyncIterator[Dict[str, Any]]:
        if behaviour == "hang-after-usage":
            yield {"type": "usage", "input": 500, "output": 0}
            yield {"type": "text-delta", "text": "Hel"}
        self.reached.set()
        await asyncio.Event().wait()
        yield {"type": "text-delta", "text": "never"}

    async def _reply(self, behaviour: str) -> ModelReply:
        if behaviour == "hang":
            self.reached.set()
            await asyncio.Event().wait()
        if behaviour == "fail":
            raise ModelError("busy", code="RATE_LIMITED", status=429)
        return ModelReply("ok", usage=USAGE)


async def retry_all(failure: Any, next: Any) -> Any:
    return kerman.Retry()


async def cancel_when(loop: AgentLoop, reached: asyncio.Event, prompt: str) -> None:
    reached.clear()
    loop.followup(prompt)
    await reached.wait()
    loop.cancel()
    await loop.when_idle()


async def session(loop: AgentLoop, model: Turns) -> None:
    """Five turns: cancelled before the stream's first chunk; cancelled mid-stream after usage;
    a non-streamed reply cancelled; cancelled in ``before_request`` (no request made); a
    request that failed and was retried."""
    await cancel_when(loop, model.reached, "one")
    await cancel_when(loop, model.reached, "two")
    await cancel_when(loop, model.reached, "three")
    holding = asyncio.Event()

    async def hold(request: Any, next: Callable[[], Any]) -> Any:
        if request.turn == 4:
            holding.set()
            await asyncio.Event().wait()
        return await next()

    loop.before_request(hold)
    await cancel_when(loop, holding, "four")
    loop.request_error(retry_all)
    await loop.run("five")


def check_session(log: Any) -> None:
    book = ledger(log, pricer=lambda r: Decimal("0.5"))
    got = [(r.turn, r.outcome, r.usage) for r in book.requests]
    assert got == [
        (1, "interrupted", None),
        (2, "interrupted", {"input": 500, "output": 0}),
        (3, "interrupted", None),
        (5, "failed", None),
        (5, "completed", USAGE),
    ]
    cancelled = book.requests[0]
    assert cancelled.cost is None and cancelled.totals.unpriced == 1  # it was sent: unknown, never 0
    assert len(cancelled.seqs) == 1  # its one event, the loop's cancelled finish
    [finish] = [log[s].data["chunk"] for s in cancelled.seqs]
    assert finish == {"type": "finish", "reason": "cancelled"}
    t = book.session
    assert (t.requests, t.failed, t.input, t.output) == (5, 1, 600, 10)
    assert t.cost is None and t.known_cost == Decimal("1.0")  # the two requests with usage
    assert book.turn(4).requests == 0


def test_every_request_a_cancel_cut_is_counted_once_and_one_cancelled_before_the_call_is_not() -> None:
    async def main() -> None:
        model = Turns("hang-stream", "hang-after-usage", "hang", "fail", "ok")
        loop = AgentLoop(model)
        await session(loop, model)
        assert model.calls == 4 + 1  # turn 4 never called the model
        check_session(loop.log)
        assert loop.spent()["session"]["requests"] == 5
        # Only what was visible is in the history the next request carries.
        history = [m for m in loop.history if m.role == "assistant"]
        assert [m.text for m in history] == ["Hel", "ok"]
        await loop.aclose()

    asyncio.run(main())


def test_the_budget_is_spent_by_cancelled_requests_after_a_restart(tmp_path: Any) -> None:
    async def first() -> None:
        store = kerman.FileStore(str(tmp_path))
        with store.create("s") as log:
            model = Turns("hang-stream", "hang-after-usage", "hang", "fail", "ok")
            loop = AgentLoop(model, log, budget=kerman.Budget(requests=100))
            await session(loop, model)
            await loop.aclose()

    async def second() -> None:
        async def never(request: kerman.ModelRequest) -> ModelReply:
            raise AssertionError("the budget is spent: no request is made")

        store = kerman.FileStore(str(tmp_path))
        with store.open("s") as log:
            check_session(log)
            loop = AgentLoop(never, log, budget=kerman.Budget(requests=5))
            assert loop.spent()["session"]["requests"] == 5
            with pytest.raises(RunError) as raised:
                await loop.run("more")
            assert (raised.value.ending["limit"], raised.value.ending["spent"]) == ("requests", 5)
            await loop.aclose()

    asyncio.run(first())
    asyncio.run(second())


def test_a_cancel_before_the_first_chunk_spends_no_usd_budget() -> None:
    # As a request that failed before its first chunk: counted, but nothing was reported, so a
    # USD limit is not stopped for good by it (test_failed_requests.py).
    async def main() -> None:
        model = Turns("hang-stream", "ok")
        loop = AgentLoop(model, budget=kerman.Budget(usd=1, pricer=lambda r: Decimal("0.001")))
        await cancel_when(loop, model.reached, "one")
        await loop.run("two")
        used = loop.spent()["session"]
        assert (used["requests"], used["unpriced"]) == (2, 0)
        await loop.aclose()

    asyncio.run(main())


# -- Fallback ------------------------------------------------------------------------------------


def priced(request: Any) -> Decimal:
    return Decimal("0.25") if request.usage else Decimal(0)


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "not-streaming"])
@asynctest
async def test_each_model_a_fallback_tried_is_one_request_with_its_model(stream: bool) -> None:
    with (
        FakeServer("openai-chat", model="model-a") as a,
        FakeServer("anthropic", model="model-b") as b,
        FakeServer("gemini", model="model-c") as c,
    ):
        a.add(HttpError(429, "slow down"))
        b.add(HttpError(500, "down"))
        c.add(Reply(text="from c", usage=USAGE))
        models = [
            make("openai-chat", a, model="model-a", retry=None, stream=stream),
            make("anthropic", b, model="model-b", retry=None, stream=stream),
            make("gemini", c, model="model-c", retry=None, stream=stream),
        ]
        loop = AgentLoop(Fallback(models), budget=kerman.Budget(requests=100))
        result = await loop.run("hi")
        assert result.text == "from c"
        book = ledger(loop.log, pricer=priced)
        got = [(r.outcome, r.model, r.provider, r.usage is None) for r in book.requests]
        assert got == [
            ("failed", "model-a", "openai", True),
            ("failed", "model-b", "anthropic", True),
            ("completed", "model-c", "google", False),
        ]
        # The failures are logged as the models reported them, streaming or not.
        chunks = [e.data["chunk"] for e in loop.log.events(types="assistant/chunk")]
        finishes = [chunk for chunk in chunks if chunk["type"] == "finish"]
        assert [(f["reason"], f["error"]["code"], f["error"].get("status"), f.get("model")) for f in finishes[:2]] == [
            ("error", "RATE_LIMITED", 429, "model-a"),
            ("error", "SERVER_ERROR", 500, "model-b"),
        ]
        [reply] = list(loop.log.events(types="assistant/message"))
        if stream:  # the reply cites its own chunks
            views = [e.chunk for e in loop.log.events(view=True) if isinstance(e, kerman.events.AssistantChunk)]
            named = [(c.model, c.provider) for c in views if isinstance(c, kerman.events.FinishChunk) and c.reason == "error"]
            assert named == [("model-a", "openai"), ("model-b", "anthropic")]
            shown = [format_event(e) for e in loop.log.events(types="assistant/chunk")]
            assert "finish error: " in shown[0] and shown[0].endswith("[RATE_LIMITED] (model-a)")  # kerman log show
            assert all(book.requests[2].seqs[0] > s for s in book.requests[1].seqs)
            assert set(reply.source_event_seqs or ()) == set(book.requests[2].seqs[:-1])
        else:  # the failures' finishes are all the chunks, logged before the reply, which cites none
            assert chunks == finishes[:2]
            assert not reply.source_event_seqs
            assert all(reply.seq > s for r in book.requests[:2] for s in r.seqs)
        t = book.session
        assert (t.requests, t.failed, t.input, t.output) == (3, 2, 100, 10)
        assert t.cost is None and t.known_cost == Decimal("0.25")  # the failed two reported nothing
        assert loop.spent()["session"]["requests"] == 3 == len(a.requests) + len(b.requests) + len(c.requests)
        await loop.aclose()


@asynctest
async def test_a_fallback_retried_from_its_first_model_counts_every_attempt() -> None:
    async def no_wait(seconds: float) -> None:
        pass

    with FakeServer("openai-chat", model="model-a") as a, FakeServer("anthropic", model="model-b") as b:
        a.add(HttpError(429, "busy", headers={"retry-after": "0"}), Reply(text="a again", usage=USAGE))
        b.add(HttpError(500, "down"))
        models = [make("openai-chat", a, model="model-a", retry=None), make("anthropic", b, model="model-b", retry=None)]
        loop = AgentLoop(Fallback(models), budget=kerman.Budget(requests=100))
        loop.request_error(retry_policy(sleep=no_wait, jitter=0))
        result = await loop.run("hi")
        assert result.text == "a again"
        book = ledger(loop.log, pricer=None)
        got = [(r.outcome, r.model) for r in book.requests]
        assert got == [("failed", "model-a"), ("failed", "model-b"), ("completed", "model-a")]
        # every model failed: each yielded its failed finish, the loop added none
        finishes = [e.data["chunk"] for e in loop.log.events(types="assistant/chunk") if e.data["chunk"]["type"] == "finish"]
        assert [f.get("model") for f in finishes if f["reason"] == "error"] == ["model-a", "model-b"]
        assert loop.spent()["session"]["requests"] == 3 == book.session.requests == len(a.requests) + len(b.requests)
        await loop.aclose()


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "not-streaming"])
@asynctest
async def test_a_fallback_budget_with_requests_is_spent_by_its_inner_attempts(stream: bool) -> None:
    # Two requests allowed: the first model's failure and the second model's reply spend them,
    # so the next turn is refused at its claim.
    with FakeServer("openai-chat", model="model-a") as a, FakeServer("anthropic", model="model-b") as b:
        a.add(HttpError(429, "busy"))
        b.add(Reply(text="from b", usage=USAGE))
        models = [
            make("openai-chat", a, model="model-a", retry=None, stream=stream),
            make("anthropic", b, model="model-b", retry=None, stream=stream),
        ]
        loop = AgentLoop(Fallback(models), budget=kerman.Budget(requests=2))
        await loop.run("hi")
        with pytest.raises(RunError) as raised:
            await loop.run("more")
        assert (raised.value.ending["at"], raised.value.ending["limit"], raised.value.ending["spent"]) == ("claim", "requests", 2)
        await loop.aclose()


def test_a_fallback_failure_after_output_began_is_not_moved_on_and_stays_one_request() -> None:
    async def cut(request: kerman.ModelRequest) -> AsyncIterator[Dict[str, Any]]:
        yield {"type": "text-delta", "text": "half"}
        raise ModelError("cut", code="STREAM_INTERRUPTED")

    calls: List[int] = []

    async def second(request: kerman.ModelRequest) -> ModelReply:
        calls.append(1)
        return ModelReply("never")

    async def main() -> None:
        loop = AgentLoop(Fallback([cut, second]))
        with pytest.raises(RunError):
            await loop.run("hi")
        assert calls == []
        book = ledger(loop.log, pricer=None)
        assert [(r.outcome, r.model) for r in book.requests] == [("failed", None)]
        await loop.aclose()

    asyncio.run(main())


# -- Fallback, not streaming --------------------------------------------------------------------


@asynctest
async def test_a_non_streaming_fallback_whose_models_all_failed_counts_each_once() -> None:
    with FakeServer("openai-chat", model="model-a") as a, FakeServer("anthropic", model="model-b") as b:
        a.add(HttpError(429, "busy"))
        b.add(HttpError(500, "down"))
        models = [
            make("openai-chat", a, model="model-a", retry=None, stream=False),
            make("anthropic", b, model="model-b", retry=None, stream=False),
        ]
        loop = AgentLoop(Fallback(models), budget=kerman.Budget(requests=100))
        with pytest.raises(RunError) as raised:
            await loop.run("hi")
        assert raised.value.ending["error"]["code"] == "SERVER_ERROR"
        book = ledger(loop.log, pricer=None)
        assert [(r.outcome, r.model, r.provider) for r in book.requests] == [
            ("failed", "model-a", "openai"),
            ("failed", "model-b", "anthropic"),
        ]
        # each model's failed finish, named; the loop added none of its own for the last
        finishes = [e.data["chunk"] for e in loop.log.events(types="assistant/chunk")]
        assert [(f["error"]["code"], f["model"]) for f in finishes] == [("RATE_LIMITED", "model-a"), ("SERVER_ERROR", "model-b")]
        assert loop.spent()["session"]["requests"] == 2 == book.session.requests == len(a.requests) + len(b.requests)
        await loop.aclose()
