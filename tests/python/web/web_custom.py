"""A session factory whose model appends two plugin records per reply, and a custom-event
mapping for ``kerman serve --custom web_custom:handoffs_only`` (test_web_custom.py)."""

from __future__ import annotations

from typing import Any, Optional

import kerman
from kerman.ui import Custom


async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
    assert request.loop is not None
    request.loop.log.append("myframework/handoff", {"from": "triage", "to": "billing"})
    request.loop.log.append("myframework/trace", {"span": "s1"})
    return kerman.ModelReply("done")


def factory(log: kerman.SessionLog) -> kerman.AgentLoop:
    return kerman.AgentLoop(model, log=log)


def handoffs_only(event: Any) -> Optional[Custom]:
    if event.type == "myframework/handoff":
        return Custom("handoff", event.data)
    return None


not_callable = 42
