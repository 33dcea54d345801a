"""A loop whose model calls an MCP tool that reports progress, for the web chat's progress bar
(``--model web_progress_models:factory``): the tests' MCP server (``mcp/mcp_server.py``, over
stdio) runs ``progress`` with 4 steps; then the model answers ``done``."""

from __future__ import annotations

import sys
from pathlib import Path

import kerman
from kerman.mcp import MCPServer

SERVER = str(Path(__file__).resolve().parent.parent / "mcp" / "mcp_server.py")


async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
    if request.step > 1:  # the tool's result is in the history
        return kerman.ModelReply("done")
    return kerman.ModelReply([{"type": "tool-call", "id": "p1", "name": "progress", "arguments": '{"steps": 4}'}])


def factory(log: kerman.SessionLog) -> kerman.AgentLoop:
    return kerman.AgentLoop(model, log=log, tools=[MCPServer.stdio(sys.executable, [SERVER])])
