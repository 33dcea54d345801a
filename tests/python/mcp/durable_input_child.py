"""The client process of test_mcp_durable_input.py: ``ROOT MARKER``. Creates session ``s`` in
a file store, runs one turn whose model calls the input server's ``transfer`` tool
(``durable_input=True``), and once the turn waits prints ``{"status", "decisions"}`` as one JSON
line, then hangs until the parent kills it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import kerman
from kerman import FileStore, ModelReply
from kerman.mcp import MCPServer

SERVER = str(Path(__file__).with_name("mcp_input_server.py"))


def server(marker: str) -> MCPServer:
    return MCPServer.stdio(sys.executable, [SERVER], env={"KERMAN_MCP_MARKER": marker}, durable_input=True)


def model():
    async def reply(request):
        if len(request.messages) > 1:  # the tool's result is in the history
            return ModelReply("done")
        return ModelReply([{"type": "tool-call", "id": "c1", "name": "transfer", "arguments": '{"amount": 5}'}])

    return reply


async def main(root: str, marker: str) -> None:
    log = FileStore(root, durability="strict").create("s")
    loop = kerman.AgentLoop(model(), log=log, tools=[server(marker)])
    loop.followup("send 5")
    await loop.when_idle()
    await log.flush()  # strict is a group commit: the request is on disk before the parent reads it
    print(json.dumps({"status": loop.status, "decisions": [d.decision_id for d in loop.decisions]}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main(sys.argv[1], sys.argv[2]))
