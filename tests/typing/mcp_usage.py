"""A user's script with kerman.mcp, type-checked with mypy --strict by tests/python/mcp/test_mcp_typing.py."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Union

import kerman
from kerman.mcp import Elicitation, MCPServer, MCPServerError, MCPTool, Progress
from kerman.models import ScriptedModel


def on_progress(update: Progress) -> None:
    print(update.tool, update.progress, update.total, update.message)


async def on_elicit(request: Elicitation) -> Optional[Dict[str, Any]]:
    return {"ok": True} if request.schema is not None else None


async def main() -> None:
    files = MCPServer.stdio(sys.executable, ["server.py"], env={"X": "1"}, prefix="fs_", filter=["read"], timeout=30.0)
    remote = MCPServer.http(
        "http://127.0.0.1:8000/mcp", headers={"Authorization": "Bearer t"}, on_progress=on_progress, on_elicit=on_elicit
    )
    loop = kerman.AgentLoop(ScriptedModel(["done"]), tools=[files])
    loop.add_tools(remote)
    tools: List[kerman.Tool] = await files.list_tools()
    adapters = [t for t in tools if isinstance(t, MCPTool)]
    effects: List[str] = [t.effect for t in adapters]
    message: kerman.UserMessage = await files.resource("memo://x")
    prompt: List[Union[kerman.UserMessage, kerman.AssistantMessage]] = await files.prompt("review", {"code": "x"})
    blocks: List[Dict[str, Any]] = await files.read_resource("memo://x")
    connected: bool = files.connected
    try:
        await remote.list_prompts()
    except MCPServerError as e:
        print(e, effects, message, prompt, blocks, connected)
    await loop.aclose()
