"""Helpers of the typed-tool tests: one tool call through a real ``AgentLoop`` (a scripted model
asks for the call, then says "done"), and readers of what the loop logged for it."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List, Optional

import kerman
from kerman.models import ScriptedModel


class Ran:
    """What one loop run left: the loop, the ``tool/result`` events and the ``agent/error``
    events, in order."""

    def __init__(self, loop: kerman.AgentLoop, errors: List[Any]) -> None:
        self.loop = loop
        self.results = [e for e in loop.log.events() if e.type == "tool/result"]
        self.errors = errors

    @property
    def result(self) -> Any:
        assert len(self.results) == 1, [e.data for e in self.results]
        return self.results[0]

    def text(self, index: int = 0) -> str:
        return result_text(self.results[index])

    def is_error(self, index: int = 0) -> bool:
        return bool(self.results[index].data["message"]["content"][0].get("isError", False))


def result_text(event: Any) -> str:
    content = event.data["message"]["content"][0]["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def call_block(arguments: Any, name: str = "t", call_id: str = "c1") -> Dict[str, Any]:
    """A tool-call block; ``arguments`` a str is sent as it is, anything else as its JSON."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "tool-call", "id": call_id, "name": name, "arguments": text}


def run(tool: Any, *calls: Any, name: str = "t") -> Ran:
    """Registers ``tool`` (a function, with ``loop.tool``, or a ``Tool``) and runs one turn
    whose first reply calls it once per item of ``calls`` (arguments, one step), then ends."""
    return asyncio.run(_run(tool, [call_block(c, name, f"c{i + 1}") for i, c in enumerate(calls)], name))


async def _run(tool: Any, blocks: List[Dict[str, Any]], name: str) -> Ran:
    loop = kerman.AgentLoop(ScriptedModel([kerman.ModelReply(blocks), "done"]))
    if isinstance(tool, kerman.Tool):
        loop.tool(tool)
    else:
        loop.tool(tool, name=name)
    errors: List[Any] = []
    loop.on("agent/error", errors.append)
    loop.followup("go")
    await loop.when_idle()
    await loop.aclose()
    return Ran(loop, errors)


def spec_of(fn: Any, name: Optional[str] = None, **kwargs: Any) -> Dict[str, Any]:
    """The spec the model sees for ``fn`` registered with ``loop.tool``."""
    loop = kerman.AgentLoop(ScriptedModel([]))
    loop.tool(fn, name=name, **kwargs)
    [tool] = loop.tools.values()
    return tool.spec()


def parameters_of(fn: Any) -> Dict[str, Any]:
    return spec_of(fn)["parameters"]
