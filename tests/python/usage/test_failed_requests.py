"""A model request that failed before its first chunk (a refused connection, an HTTP 429) is in
the log: the loop ends each failed attempt with a failed ``finish`` chunk, so the ledger and
the budget count every attempt once, retries each, never twice."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from decimal import Decimal
from typing import Any, AsyncIterator, Dict, List

import pytest

import kerman
from kerman import AgentLoop, Approve, ModelError, ModelReply, RunError
from kerman.usage import ledger

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "providers"))

from provider_helpers import PROTOCOLS, asynctest, chunks, done, make, run  # noqa: E402

from kerman.providers.retry import retry_policy  # noqa: E402
from kerman.providers.testing import FakeServer, HttpError, Reply  # noqa: E402

USAGE = {"input": 100, "output": 10}


class Failing:
    """Fails its first ``fail`` requests before any chunk (raising, or from a stream that raises
    before it yields), then answers with ``USAGE``."""

    def __init__(self, fail: int, stream: bool = False) -> None:
        self.fail = fail
        self.stream = stream
        self.calls = 0

    def __call__(self, request: kerman.ModelRequest) -> Any:
        self.calls += 1
        failing = self.calls <= self.fail
        if self.stream:
            return self._stream(failing)
        if failing:
            raise ModelError("rate limited", code="RATE_LIMITED", status=429)
        return ModelReply("ok", usage=USAGE)

    async def _stream(self, failing: bool) -> AsyncIterator[Dict[str, Any]]:
        if failing:
            raise ModelError("connection refused", code="CONNECTION")
        yield {"type": "text-delta", "text": "ok"}
        yield dict(USAGE, type="usage")
        yield {"type": "finish", "reason": "stop"}


async def retry_all(failure: Any, next: Any) -> Any:
    return kerman.Retry()


def failed_finishes(log: Any) -> List[Dict[str, Any]]:
    return [c for c in (e.data["chunk"] for e in log.events(types="assistant/chunk")) if c["type"] == "finish" and c["reason"] == "error"]


@pytest.mark.parametrize("stream", [False, True], ids=["raises", "stream-raises"])
def test_each_attempt_that_failed_before_its_first_chunk_is_one_failed_request(stream: bool) -> None:
    async def main() -> None:
        model = Failing(fail=2, stream=stream)
        loop = AgentLoop(model)
        loop.request_error(retry_all)
        await loop.run("go")
        code = "CONNECTION" if stream else "RATE_LIMITED"
        assert [f["error"]["code"] for f in failed_finishes(loop.log)] == [code, code]
        book = ledger(loop.log, pricer=lambda r: Decimal("0.01"))
        assert [(r.outcome, r.usage, r.partial) for r in book.requests] == [("failed", None, False)] * 2 + [("completed", USAGE, False)]
        # Each failed attempt is one event: its failed finish, never merged with the next.
        assert [len(r.seqs) for r in book.requests[:2]] == [1, 1]
        failed = book.requests[0]
        assert failed.cost is None and failed.totals.unpriced == 1  # no usage reported: unknown, not 0
        t = book.session
        assert (t.requests, t.failed, t.prompt, t.output, t.unpriced) == (3, 2, 100, 10, 2)
        assert t.cost is None and t.known_cost == Decimal("0.01")
        await loop.aclose()

    asyncio.run(main())


def test_a_turn_that_fails_before_the_first_chunk_counts_its_one_request() -> None:
    async def main() -> None:
        loop = AgentLoop(Failing(fail=1))
        with pytest.raises(RunError):
            await loop.run("go")
        book = ledger(loop.log, pricer=None)
        assert [(r.turn, r.step, r.outcome) for r in book.requests] == [(1, 1, "failed")]
        [finish] = failed_finishes(loop.log)
        [end] = [e.data["reason"] for e in loop.log.events(types="turn/end")]
        assert finish["error"] == end["error"]  # the failure the turn ended with, as request_error got it
        await loop.aclose()

    asyncio.run(main())


def test_a_model_that_raises_an_ordinary_exception_made_a_failed_request() -> None:
    async def broken(request: kerman.ModelRequest) -> ModelReply:
        raise RuntimeError("boom")

    async def main() -> None:
        loop = AgentLoop(broken)
        with pytest.raises(RunError):
            await loop.run("go")
        [finish] = failed_finishes(loop.log)
        assert "boom" in finish["error"]["message"]
        assert ledger(loop.log, pricer=None).session.failed == 1
        await loop.aclose()

    asyncio.run(main())


def test_a_request_cancelled_before_its_first_chunk_logs_no_failure_but_is_counted() -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def slow(request: kerman.ModelRequest) -> ModelReply:
            started.set()
            await asyncio.Event().wait()
            raise AssertionError("never answered")

        loop = AgentLoop(slow)
        loop.followup("go")
        await started.wait()
        loop.cancel()
        await loop.when_idle()
        assert failed_finishes(loop.log) == []
        # A cancellation is not a failure of the model, but the request was made: it is an
        # empty interrupted message (test_cancelled_and_fallback_requests.py).
        [request] = ledger(loop.log, pricer=None).requests
        assert (request.outcome, request.usage, request.cost) == ("interrupted", None, None)
        await loop.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("protocol", PROTOCOLS)
@asynctest
async def test_an_http_request_that_failed_is_counted_once_per_attempt(protocol: str) -> None:
    with FakeServer(protocol) as server:
        server.add(HttpError(429, "slow down"), HttpError(503, "Overloaded"), Reply(text="done", usage=USAGE))
        model = make(protocol, server, retry=retry_policy(base_delay=0, jitter=0))
        loop = await run(model, "go")
        assert len(server.requests) == 3
        assert [c["error"].get("status") for c in chunks(loop.log) if c["type"] == "finish" and c["reason"] == "error"] == [429, 503]
        book = ledger(loop.log, pricer=None)
        assert [(r.outcome, r.usage) for r in book.requests][:2] == [("failed", None), ("failed", None)]
        t = book.session
        assert (t.requests, t.failed, t.partial, t.output) == (3, 2, 0, 10)
        await done(loop, model)


@asynctest
async def test_streams_cut_without_usage_are_one_request_each() -> None:
    # Text streamed, then the connection dropped with no usage and no finish, twice: the loop
    # ends each attempt, so the next attempt's chunks are not taken for the same request.
    with FakeServer("openai-chat") as server:
        server.add(Reply(text=["a", "b", "c"], cut_after=2), Reply(text=["d", "e", "f"], cut_after=2), Reply(text=["x", "y"], usage=USAGE))
        model = make("openai-chat", server, retry=retry_policy(base_delay=0, jitter=0))
        loop = await run(model, "go")
        book = ledger(loop.log, pricer=None)
        assert [r.outcome for r in book.requests] == ["failed", "failed", "completed"]
        assert book.session.requests == 3 == len(server.requests)
        await done(loop, model)


def test_the_budget_counts_each_failed_attempt_as_a_request() -> None:
    async def main() -> None:
        model = Failing(fail=5)
        loop = AgentLoop(model, budget=kerman.Budget(requests=3))
        loop.request_error(retry_all)
        with pytest.raises(RunError) as raised:
            await loop.run("go")
        assert raised.value.ending["limit"] == "requests" and model.calls == 3
        assert loop.spent()["session"]["requests"] == 3 == ledger(loop.log, pricer=None).session.requests
        await loop.aclose()

    asyncio.run(main())


def test_a_failure_that_streamed_nothing_does_not_spend_a_usd_budget() -> None:
    # Nothing was produced, so nothing is billed: the retry is made (a request of unknown price
    # that did produce something spends a USD budget, test_budget.py).
    async def main() -> None:
        model = Failing(fail=1)
        loop = AgentLoop(model, budget=kerman.Budget(usd=1, pricer=lambda r: Decimal("0.001")))
        loop.request_error(retry_all)
        await loop.run("go")
        assert model.calls == 2
        used = loop.spent()["session"]
        assert (used["requests"], used["unpriced"]) == (2, 0)
        await loop.aclose()

    asyncio.run(main())


def test_an_approved_budget_request_covers_one_attempt_and_the_retry_asks_again() -> None:
    """Approve() lets one model request through. A request that failed before its first chunk is
    logged (its failed finish), so the approval is spent with it, and the retry, another
    request, asks again."""

    class Spends:
        def __init__(self) -> None:
            self.calls = 0

        async def __call__(self, request: kerman.ModelRequest) -> ModelReply:
            self.calls += 1
            if self.calls == 3:
                raise ModelError("overloaded", code="OVERLOADED")
            usage = {"input": 500, "output": 100}
            if self.calls >= 4:
                return ModelReply("done", usage=usage)
            return ModelReply([{"type": "tool-call", "id": f"c{self.calls}", "name": "look", "arguments": "{}"}], usage=usage)

    async def look(args: Any, ctx: Any) -> str:
        return "seen"

    def asked(loop: AgentLoop) -> int:
        return len([e for e in loop.log.events(types="decision/requested") if e.data["kind"] == "budget"])

    async def main() -> None:
        model = Spends()
        loop = AgentLoop(model, tools=[kerman.Tool("look", look)], budget=kerman.Budget(tokens=1000, ask=True))
        loop.request_error(retry_all)
        loop.followup("look around")
        await loop.when_idle()
        [first] = loop.decisions  # 1200 tokens spent: the third request asks
        assert model.calls == 2 and asked(loop) == 1
        loop.decide(first.decision_id, Approve())
        await loop.when_idle()
        # The approved request failed with nothing streamed; its retry waits for a person.
        assert model.calls == 3 and loop.status == "waiting" and asked(loop) == 2
        [second] = loop.decisions
        assert json.loads(second.arguments)["used"]["requests"] == 3
        loop.decide(second.decision_id, Approve())
        await loop.when_idle()
        assert model.calls == 4 and [e.data["reason"]["kind"] for e in loop.log.events(types="turn/end")] == ["completed"]
        await loop.aclose()

    asyncio.run(main())


def test_the_ui_streams_show_the_retrys_whole_reply_after_a_failed_attempt() -> None:
    # A failed finish ends an attempt that showed nothing: the retry's whole reply is shown.
    from kerman.ui import AgUiProjection, VercelProjection

    async def main() -> List[Any]:
        loop = AgentLoop(Failing(fail=1))
        loop.request_error(retry_all)
        await loop.run("go")
        events = list(loop.log.events())
        await loop.aclose()
        return events

    events = asyncio.run(main())
    vercel = VercelProjection()
    parts = [p for e in events for p in vercel.feed(e)]
    assert [p["delta"] for p in parts if p["type"] == "text-delta"] == ["ok"], parts
    agui = AgUiProjection("t")
    out = [x for e in events for x in agui.feed(e)]
    assert [x["delta"] for x in out if x["type"] == "TEXT_MESSAGE_CONTENT"] == ["go", "ok"], out  # the prompt, the reply
