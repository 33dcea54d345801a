"""``kerman chat --usage``: each ended turn's usage on a line of its own, from the events shown."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import kerman
from kerman.cli._chat_screen import Chat


def test_each_turn_shows_its_own_usage_when_asked() -> None:
    async def model(request: Any) -> Any:
        return kerman.ModelReply([{"type": "text", "text": "hi"}], usage={"input": 10 * request.turn, "output": 2, "cacheRead": 4})

    async def main() -> str:
        loop = kerman.AgentLoop(model)
        for prompt in ("a", "b"):
            loop.followup(prompt)
            await loop.when_idle()
        out = io.StringIO()
        chat = Chat(loop, out, resumed=True, echo=False)
        chat.track_usage()
        chat.catch_up()
        plain = io.StringIO()
        Chat(loop, plain, resumed=True, echo=False).catch_up()
        assert "usage" not in plain.getvalue()  # only with --usage
        await loop.aclose()
        return out.getvalue()

    screen = asyncio.run(main())
    lines = [line for line in screen.splitlines() if "usage:" in line]
    assert lines == [
        "  [turn 1 usage: 1 requests, 6 in + 4 cache read + 0 cache write, 2 out (0 reasoning), 0 tool calls, cost unknown]",
        "  [turn 2 usage: 1 requests, 16 in + 4 cache read + 0 cache write, 2 out (0 reasoning), 0 tool calls, cost unknown]",
    ]
