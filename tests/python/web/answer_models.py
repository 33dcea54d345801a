"""The model factory of test_web_answers.py (``--model answer_models:factory``): ``ask`` makes
the model call ``choose``, whose gate asks the person for an answer matching ``SCHEMA``; after
the answer (the call's result) the model says ``done``."""

from __future__ import annotations

from typing import Any

import kerman

SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}}, "required": ["colour"]}


async def model(request: kerman.ModelRequest):  # noqa: ANN201
    if request.step > 1:
        yield {"type": "text-delta", "text": "done"}
        return
    yield {"type": "tool-call", "id": f"call-{request.turn}", "name": "choose", "arguments": "{}"}


def factory(log: kerman.SessionLog) -> kerman.AgentLoop:
    loop = kerman.AgentLoop(model, log=log)

    @loop.tool
    async def choose() -> str:
        """Asks the user to choose a colour."""
        raise AssertionError("an answered call does not run")

    @loop.before_tool
    async def gate(call: Any, next: Any) -> Any:
        return kerman.Ask(note="which colour?", schema=SCHEMA)

    return loop
