"""Helpers of the kerman.mcp tests: turns through a real ``AgentLoop`` whose scripted model
calls MCP tools, and readers of what the loop logged."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List

import kerman
from conftest import SERVER
from kerman.mcp import MCPServer
from kerman.models import ScriptedModel


def stdio(**options: Any) -> MCPServer:
    """The test server as a subprocess."""
    return MCPServer.stdio(sys.executable, [SERVER], **options)


def call(name: str, arguments: Dict[str, Any], call_id: str = "c1") -> kerman.ModelReply:
    """A model reply that calls tool ``name`` once."""
    return kerman.ModelReply([{"type": "tool-call", "id": call_id, "name": name, "arguments": json.dumps(arguments)}])


def results(loop: kerman.AgentLoop) -> List[Any]:
    """The ``tool/result`` events of the loop's log, in order."""
    return [e for e in loop.log.events() if e.type == "tool/result"]


def block(event: Any) -> Dict[str, Any]:
    """The tool-result block of a ``tool/result`` event."""
    return event.data["message"]["content"][0]  # type: ignore[no-any-return]


def text(event: Any) -> str:
    content = block(event)["content"]
    return content if isinstance(content, str) else "\n".join(b.get("text", "") for b in content)


def tool_names(request: Any) -> List[str]:
    return [t["name"] for t in request.tools]


async def turn(loop: kerman.AgentLoop, prompt: str = "go") -> None:
    loop.followup(prompt)
    await loop.when_idle()


def scripted(*replies: Any) -> ScriptedModel:
    return ScriptedModel(list(replies))
