"""The model factories the web tests serve (``kerman serve ... --model web_models:factory``).

What the model does depends on the prompt, so a test drives it through the HTTP API alone:

* ``count N``: streams ``1 `` … ``N `` a chunk every 20 ms (a turn long enough to cut a stream in);
* ``use the tool``: calls ``hold``, a tool that returns once steering input is pending (or after
  60 s), so the turn is inside a tool call until the test steers;
* ``slow``: streams one chunk, then waits until cancelled (or 60 s);
* ``fail``: raises a ``ModelError``;
* anything else: ``echo: <text>``.

After a tool call the reply is ``tool said: <result>``, followed by the steering it got.
"""

from __future__ import annotations

import asyncio

import kerman

PACE = 0.02
PATIENCE = 60.0


async def model(request: kerman.ModelRequest):  # noqa: ANN201
    last = request.messages[-1] if request.messages else None
    if isinstance(last, kerman.UserMessage) and any(b.get("type") == "tool-result" for b in last.content) or request.step > 1:
        results = [b for m in request.messages for b in m.content if b.get("type") == "tool-result"]
        said = results[-1]["content"][0]["text"] if results else "nothing"
        steering = " / ".join(m.text for m in request.entered)
        yield {"type": "text-delta", "text": f"tool said: {said}"}
        if steering:
            yield {"type": "text-delta", "text": f"; steered by: {steering}"}
        return
    text = request.entered[-1].text if request.entered else ""
    if text.startswith("count "):
        for i in range(1, int(text.split()[1]) + 1):
            yield {"type": "text-delta", "text": f"{i} "}
            await asyncio.sleep(PACE)
    elif text == "use the tool":
        yield {"type": "text-delta", "text": "Calling the tool."}
        yield {"type": "tool-call", "id": f"call-{request.turn}", "name": "hold", "arguments": '{"why": "testing"}'}
    elif text == "slow":
        yield {"type": "text-delta", "text": "Starting"}
        await asyncio.sleep(PATIENCE)
    elif text == "fail":
        raise kerman.ModelError("the model is down", code="TEST_FAILURE")
    else:
        yield {"type": "text-delta", "text": f"echo: {text}"}


def factory(log: kerman.SessionLog) -> kerman.AgentLoop:
    loop = kerman.AgentLoop(model, log=log)

    @loop.tool
    async def hold(why: str) -> str:
        """Returns once steering input is pending."""
        inbox = loop.inbox
        deadline = asyncio.get_running_loop().time() + PATIENCE
        while not inbox.next_step and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(PACE)
        return f"held for {why}"

    return loop
