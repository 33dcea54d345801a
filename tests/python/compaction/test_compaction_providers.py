"""The context-length path through the providers' loopback servers: a request the server refuses
as too long is compacted and sent again, once; the request that goes out the second time holds
only what the compaction left (checked in the body the server received)."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "providers"))
from provider_helpers import asynctest, done, make, run  # noqa: E402

import kerman  # noqa: E402
from kerman.compaction import Compactor, SlidingWindow  # noqa: E402
from kerman.providers.testing import FakeServer, HttpError, Reply  # noqa: E402

TOO_LONG = {
    "openai-chat": HttpError(400, "This model's maximum context length is 128000 tokens.", kind="context_length_exceeded"),
    "openai-responses": HttpError(400, "Your input exceeds the context window of this model.", kind="context_length_exceeded"),
    "anthropic": HttpError(400, "prompt is too long: 210000 tokens > 200000 maximum"),
}


@pytest.mark.parametrize("protocol", sorted(TOO_LONG))
@asynctest
async def test_a_context_length_error_is_compacted_and_retried_once(protocol: str) -> None:
    with FakeServer(protocol) as server:
        server.add(Reply(text="first answer"), TOO_LONG[protocol], Reply(text="second answer"))
        model = make(protocol, server)
        loop = kerman.AgentLoop(model, compaction=Compactor(SlidingWindow(keep=0)))
        await run(model, "first question", loop=loop)
        await run(model, "second question", loop=loop)
        assert len(server.requests) == 3
        refused, retried = (json.dumps(r.body) for r in server.requests[1:])
        assert "first question" in refused and "first answer" in refused
        assert "first question" not in retried and "first answer" not in retried and "second question" in retried
        [record] = list(loop.log.events(types="context/compacted", view=True))
        assert record.reason == "context-length" and record.strategy == "sliding-window"
        ends = [e.data["reason"]["kind"] for e in loop.log.events(types="turn/end")]
        assert ends == ["completed", "completed"]
        # Overflowing again in a step whose retry was spent: the turn fails, nothing more compacted.
        server.add(TOO_LONG[protocol], TOO_LONG[protocol])
        await run(model, "third question", loop=loop)
        assert len(list(loop.log.events(types="context/compacted"))) == 2
        assert [e.data["reason"]["kind"] for e in loop.log.events(types="turn/end")][-1] == "error"
        await done(loop, model)
