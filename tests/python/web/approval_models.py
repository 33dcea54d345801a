"""The model factory test_browser_decisions.py serves to a ``kerman worker`` (``--app
approval_models:factory``).

``four calls`` makes the model call, in one step, ``pay`` three times (amounts 10, 20 and 30;
``pay`` needs approval) and ``colour`` once (a gate asks the person for the answer, a string).
``pay``, when it runs, appends its arguments as a JSON line to the file ``KERMAN_TEST_RUNS``
names, so the test counts executions in another process. After the results the model says
``results: <each result's text, in call order>``; anything else is echoed."""

from __future__ import annotations

import json
import os

import kerman

CALLS = (
    ("c1", "pay", {"amount": 10}),
    ("c2", "pay", {"amount": 20}),
    ("c3", "pay", {"amount": 30}),
    ("c4", "colour", {"of": "the invoice"}),
)


async def model(request: kerman.ModelRequest):  # noqa: ANN201
    if request.step > 1:
        results = [b["content"][0]["text"] for m in request.messages for b in m.content if b.get("type") == "tool-result"]
        yield {"type": "text-delta", "text": "results: " + " | ".join(results)}
        return
    text = request.entered[-1].text if request.entered else ""
    if text == "four calls":
        for call_id, name, arguments in CALLS:
            yield {"type": "tool-call", "id": f"{call_id}-{request.turn}", "name": name, "arguments": json.dumps(arguments)}
    else:
        yield {"type": "text-delta", "text": f"echo: {text}"}


def factory(log: kerman.SessionLog) -> kerman.AgentLoop:
    loop = kerman.AgentLoop(model, log=log)

    @loop.tool(needs_approval=True)
    async def pay(amount: int) -> str:
        """Pays."""
        with open(os.environ["KERMAN_TEST_RUNS"], "a") as runs:
            runs.write(json.dumps({"amount": amount}) + "\n")
        return f"paid {amount}"

    @loop.tool
    async def colour(of: str) -> str:
        """Picks a colour (never runs: the person answers)."""
        raise AssertionError("the person answers this call; the tool must not run")

    @loop.before_tool
    async def ask_for_the_colour(call, next):  # noqa: ANN001, ANN202
        if call.name == "colour":
            return kerman.Ask(note=f"Which colour for {call.arguments['of']}?", schema={"type": "string"})
        return await next()

    return loop
