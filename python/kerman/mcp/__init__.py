"""MCP servers as tools, resources and prompts of an ``AgentLoop`` (``pip install
"kerman[mcp]"``, on the official ``mcp`` package). See ``docs/mcp.md``.

``MCPServer.stdio(command, args=...)`` runs a server as a subprocess, ``MCPServer.http(url,
headers=...)`` speaks streamable HTTP; either goes in ``AgentLoop(tools=[...])`` or
``loop.add_tools(...)``.
"""

from ._adapter import MCPTool
from ._server import MCPServer
from ._types import Elicitation, MCPServerError, Progress

__all__ = ["MCPServer", "MCPServerError", "MCPTool", "Progress", "Elicitation"]
