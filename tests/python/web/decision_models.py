"""The model factory the decision route tests serve (``--model decision_models:factory``).

``pay N`` makes the model call ``pay`` with ``{"amount": N}``; ``pay`` needs approval and, when
it runs, appends its arguments as a JSON line to the file ``KERMAN_TEST_RUNS`` names, so a test
counts the executions in another process. After the tool's result the model says ``done``."""

from __future__ import annotations

import json
import os

import kerman


async def model(request: kerman.ModelRequest):  # noqa: ANN201
    if request.step > 1:
        yield {"type": "text-delta", "text": "done"}
        return
    text = request.entered[-1].text if request.entered else ""
    if text.startswith("pay "):
        amount = int(text.split()[1])
        yield {"type": "tool-call", "id": f"call-{request.turn}", "name": "pay", "arguments": json.dumps({"amount": amount})}
    else:
        yield {"type": "text-delta", "text": f"echo: {text}"}


def factory(log: kerman.SessionLog) -> kerman.AgentLoop:
    loop = kerman.AgentLoop(model, log=log)

    @loop.tool(needs_approval=True)
    async def pay(amount: int) -> str:
        """Pays."""
        with open(os.environ["KERMAN_TEST_RUNS"], "a") as runs:
            runs.write(json.dumps({"amount": amount}) + "\n")
        return "paid"

    return loop
