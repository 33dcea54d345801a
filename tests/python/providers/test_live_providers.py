"""One real tool turn per vendor, run only when its API key is in the environment
(OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY or GOOGLE_API_KEY); skipped otherwise. The
model can be changed with KERMAN_LIVE_<VENDOR>_MODEL. Each makes two requests at most."""

from __future__ import annotations

import os

import pytest
from provider_helpers import OPENED, asynctest, clock, messages, run, turn_ends

from kerman.providers import Anthropic, Gemini, OpenAIChat, OpenAIResponses

LIVE = [
    ("openai-chat", ("OPENAI_API_KEY",), lambda m: OpenAIChat(m, timeout=60), "gpt-4.1-mini"),
    ("openai-responses", ("OPENAI_API_KEY",), lambda m: OpenAIResponses(m, timeout=60), "gpt-4.1-mini"),
    ("anthropic", ("ANTHROPIC_API_KEY",), lambda m: Anthropic(m, max_tokens=256, timeout=60), "claude-haiku-4-5"),
    ("gemini", ("GEMINI_API_KEY", "GOOGLE_API_KEY"), lambda m: Gemini(m, timeout=60), "gemini-2.5-flash"),
]


@pytest.mark.parametrize("name, keys, build, default", LIVE, ids=[case[0] for case in LIVE])
@asynctest
async def test_a_live_tool_turn(name, keys, build, default):
    if not any(os.environ.get(k) for k in keys):
        pytest.skip(f"{' or '.join(keys)} is not set")
    model = build(os.environ.get(f"KERMAN_LIVE_{name.split('-')[0].upper()}_MODEL", default))
    OPENED.append(model)
    loop = await run(model, "What time is it? Use the clock tool, then answer in one short sentence.", tools=[clock])
    assert turn_ends(loop.log) == [{"kind": "completed"}], turn_ends(loop.log)
    replies = messages(loop.log)
    assert any(b["type"] == "tool-call" and b["name"] == "clock" for b in replies[0]["message"]["content"])
    answer = "".join(b.get("text", "") for b in replies[-1]["message"]["content"]).lower()
    assert "12" in answer or "noon" in answer, answer
    assert replies[0]["usage"]["input"] > 0 and replies[0]["usage"]["output"] > 0
    await loop.aclose()
