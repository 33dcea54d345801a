"""The session the otel tests export: one turn whose model calls tools in parallel (``slow``
waits until ``fast`` has run, ``broken`` raises), then answers ``done``."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Sequence

import kerman


def calling(usage: Dict[str, int], tools: Sequence[str] = ("slow", "fast")) -> Any:
    """A model that calls ``tools`` at step 1 (call ids ``c0``, ``c1``, ...) and then answers
    ``done``, each reply reporting ``usage``."""

    async def model(request: kerman.ModelRequest) -> Any:
        if request.step == 1:
            calls = [{"type": "tool-call", "id": f"c{i}", "name": name, "arguments": "{}"} for i, name in enumerate(tools)]
            return kerman.ModelReply(calls, usage=usage)
        return kerman.ModelReply("done", usage=usage)

    return model


async def tools_session(usage: Dict[str, int], tools: Sequence[str] = ("slow", "fast"), log: Any = None) -> kerman.AgentLoop:
    """Runs the turn on a new loop (on ``log`` when given) with the ``tools`` named, each reply
    reporting ``usage``; returns the idle loop."""
    loop = kerman.AgentLoop(calling(usage, tools), log=log)
    gate = asyncio.Event()

    async def slow() -> str:
        """Waits for fast."""
        await gate.wait()
        return "slow"

    async def fast() -> str:
        """Lets slow go."""
        gate.set()
        return "fast"

    async def broken() -> str:
        """Fails."""
        raise ValueError("no luck " + "x" * 300)

    for tool in (slow, fast, broken):
        if tool.__name__ in tools:
            loop.tool(tool)
    loop.followup("go")
    await loop.when_idle()
    return loop
