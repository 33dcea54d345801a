"""The ledger over real provider traffic (loopback servers speaking each vendor's wire format):
each vendor's cache semantics normalised so no token counts twice, and the usage a stream
reported before it failed recorded (marked partial) and counted once next to the retry's."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "providers"))

from provider_helpers import PROTOCOLS, asynctest, chunks, done, make, run  # noqa: E402

from kerman.providers.testing import FakeServer, HttpError, Reply  # noqa: E402
from kerman.usage import ledger  # noqa: E402

USAGE = {"input": 1000, "output": 50, "cacheRead": 600, "cacheWrite": 100, "reasoning": 10}
# What each vendor can say: Gemini reports no cache writes (its prompt count includes the cached
# tokens); every other vendor reports both.
WRITES = {"openai-chat": 100, "openai-responses": 100, "anthropic": 100, "gemini": 0}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "complete"])
@asynctest
async def test_each_vendors_prompt_count_is_split_once(protocol, stream):
    with FakeServer(protocol) as server:
        server.add(Reply(text="hi", usage=USAGE))
        model = make(protocol, server, stream=stream)
        loop = await run(model, "go")
        book = ledger(loop.log, pricer=None)
        t = book.session
        written = WRITES[protocol]
        assert (t.requests, t.failed, t.partial) == (1, 0, 0)
        # the loopback Anthropic server sends no thinking count in a complete (non-streamed) reply
        reasoning = 0 if (protocol, stream) == ("anthropic", False) else 10
        assert (t.cache_read, t.cache_write, t.output, t.reasoning) == (600, written, 50, reasoning)
        assert t.input == 1000 - 600 - written  # the fresh prompt tokens, neither cached nor counted twice
        assert t.prompt == 1000
        await done(loop, model)


@pytest.mark.parametrize("protocol", ["anthropic", "gemini"])
@asynctest
async def test_usage_reported_before_a_stream_failed_is_logged_partial_and_counted_next_to_the_retry(protocol):
    with FakeServer(protocol) as server:
        # the first reply fails mid-stream after its usage was sent (Anthropic's message_start,
        # Gemini's usageMetadata on every chunk); the retry completes
        server.add(
            Reply(
                text=["a", "b", "c"],
                usage=USAGE,
                error=HttpError(529 if protocol == "anthropic" else 503, "Overloaded"),
                error_after=3 if protocol == "anthropic" else 2,
            )
        )
        server.add(Reply(text="done", usage=USAGE))
        model = make(protocol, server)
        loop = await run(model, "go")
        partial = [c for c in chunks(loop.log) if c["type"] == "usage" and c.get("partial")]
        assert len(partial) == 1 and partial[0]["input"] == 1000
        book = ledger(loop.log, pricer=None)
        assert [(r.outcome, r.partial) for r in book.requests] == [("failed", True), ("completed", False)]
        first, second = book.requests
        assert second.totals.input == 1000 - 600 - WRITES[protocol] and second.totals.output == 50
        assert first.totals.prompt == 1000  # the failed attempt's prompt was sent and billed
        t = book.session
        assert (t.requests, t.failed, t.partial) == (2, 1, 1)
        assert t.prompt == 2000 and t.output == 50 + first.totals.output
        await done(loop, model)


@asynctest
async def test_a_failed_stream_without_usage_logs_no_usage_chunk():
    with FakeServer("openai-chat") as server:
        server.add(Reply(text=["a", "b", "c"], error=HttpError(503, "Overloaded"), error_after=2))
        model = make("openai-chat", server, retry=None)
        loop = await run(model, "go")
        assert [c for c in chunks(loop.log) if c["type"] == "usage"] == []
        book = ledger(loop.log, pricer=None)
        assert [(r.outcome, r.partial, r.usage) for r in book.requests] == [("failed", False, None)]
        assert book.session.cost is None  # no usage reported: the cost is unknown, not 0
        await done(loop, model)
