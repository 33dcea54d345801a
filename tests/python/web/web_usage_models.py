"""A model that reports usage, for the web chat's usage lines (``--model
web_usage_models:factory``): each reply is ``echo: <text>`` with 100 prompt tokens (40 of them
read from the cache) and 20 output tokens, under a budget of 2 requests per session, so the
third prompt ends its turn ``budget``."""

from __future__ import annotations

import kerman


async def model(request: kerman.ModelRequest):  # noqa: ANN201
    text = request.entered[-1].text if request.entered else ""
    yield {"type": "text-delta", "text": f"echo: {text}"}
    yield {"type": "usage", "input": 100, "output": 20, "cacheRead": 40, "cacheWrite": 0, "reasoning": 0}
    yield {"type": "finish", "reason": "stop"}


def factory(log: kerman.SessionLog) -> kerman.AgentLoop:
    return kerman.AgentLoop(model, log=log, budget=kerman.Budget(requests=2))
