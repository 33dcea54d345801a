"""OpenAI's own compaction (``OpenAICompact``) through the Responses API's loopback server: the
span goes to ``/v1/responses/compact``, and the next request sends the compaction item it
returned, verbatim, in place of the span."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "providers"))
from provider_helpers import asynctest, done, make, run  # noqa: E402

import kerman  # noqa: E402
from kerman.compaction import OpenAICompact  # noqa: E402
from kerman.models import EchoModel  # noqa: E402
from kerman.providers.testing import FakeServer, Raw, Reply  # noqa: E402

ITEM = {"type": "compaction", "id": "cmp_1", "encrypted_content": "ENCRYPTED-SUMMARY"}
COMPACTED = {
    "id": "resp_cmp_1",
    "created_at": 0,
    "object": "response.compaction",
    "output": [ITEM],
    "usage": {
        "input_tokens": 50,
        "output_tokens": 7,
        "total_tokens": 57,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    },
}


@asynctest
async def test_the_compaction_item_replaces_the_span_and_only_openai_responses_sends_it() -> None:
    with FakeServer("openai-responses") as server:
        server.add(Reply(text="a0"), Reply(text="a1"))
        model = make("openai-responses", server)
        loop = kerman.AgentLoop(model)
        await run(model, "q0", loop=loop)
        await run(model, "q1", loop=loop)
        server.add(Raw(headers={"content-type": "application/json"}, body=json.dumps(COMPACTED)), Reply(text="a2"))
        record = await loop.compact(OpenAICompact(model, keep=2))
        assert record is not None and record.strategy == "openai-compact" and record.model == "fake-model"
        assert record.native == {"provider": "openai-responses", "items": [ITEM]}
        assert record.usage is not None and (record.usage.input, record.usage.output) == (50, 7)
        compact = server.requests[2]
        assert compact.path == "/v1/responses/compact" and compact.body["model"] == "fake-model"
        assert "q0" in json.dumps(compact.body["input"]) and "q1" not in json.dumps(compact.body["input"])
        await run(model, "q2", loop=loop)
        sent = server.requests[3].body["input"]
        assert sent[0] == ITEM and "q0" not in json.dumps(sent) and "a0" not in json.dumps(sent)
        assert "q1" in json.dumps(sent) and "q2" in json.dumps(sent)
        # The other providers leave the item out: the message converts to nothing.
        [replacement] = [m for m in loop.history if m.role == "assistant" and m.content[0].get("openai")]
        assert replacement.content[0]["openai"]["item"] == ITEM
        with FakeServer("anthropic") as a, FakeServer("openai-chat") as c:
            for other in (make("anthropic", a), make("openai-chat", c)):
                assert other._convert(replacement, None) is None
        await done(loop, model)


def test_only_an_openai_responses_provider_is_taken() -> None:
    with pytest.raises(TypeError, match="OpenAIResponses"):
        OpenAICompact(EchoModel())
