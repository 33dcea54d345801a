"""A running tool call's progress in ``kerman chat``: each logged ``tool/progress`` of an MCP
tool (the tests' MCP server over stdio, its ``progress`` tool reporting 4 steps) drawn under the
call as a bar with its percentage and message, from a log a real loop wrote and in the real
command (``--tool`` naming an ``MCPServer``, a pseudo-terminal, the openai SDK against a
FakeServer); and the line for a progress without a total, and for a call that became a task."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from pathlib import Path

import pytest

import kerman
from kerman.cli._chat_screen import Chat, progress_line
from kerman.models import EchoModel, ScriptedModel

pytest.importorskip("mcp")

SERVER = str(Path(__file__).resolve().parent.parent / "mcp" / "mcp_server.py")

SCREEN = """\
  » prompt: count
  ⚙ progress({"steps": 4})
  [#####---------------]  25% step 1
  [##########----------]  50% step 2
  [###############-----]  75% step 3
  [####################] 100% step 4
  ↳ done in 4
counted
"""


def test_the_chat_draws_each_logged_progress_under_its_call(tmp_path: Path) -> None:
    from kerman.mcp import MCPServer

    async def main() -> str:
        store = kerman.FileStore(tmp_path, durability="none")
        log = store.create("chat")
        call = kerman.ModelReply([{"type": "tool-call", "id": "p1", "name": "progress", "arguments": json.dumps({"steps": 4})}])
        loop = kerman.AgentLoop(ScriptedModel([call, "counted"]), log=log, tools=[MCPServer.stdio(sys.executable, [SERVER])])
        loop.followup("count")
        await loop.when_idle()
        await loop.aclose()
        reader = kerman.AgentLoop(EchoModel(), log=log)
        out = io.StringIO()
        Chat(reader, out, resumed=True, echo=False).catch_up()
        await reader.aclose()
        await log.aclose()
        return out.getvalue()

    screen = asyncio.run(main())
    # Each step's message differs, so every update is logged (docs/mcp.md, "Progress").
    assert screen.split("  [turn")[0] == SCREEN


def view(**data: object) -> kerman.events.ToolProgress:
    event = {"seq": 5, "time": 0, "type": "tool/progress", "data": {"turn": 1, "step": 1, "callId": "c1", **data}}
    progress = kerman.events.view(event)
    assert isinstance(progress, kerman.events.ToolProgress)
    return progress


def test_a_progress_without_a_total_and_a_task_s_record() -> None:
    assert progress_line(view(progress=3, message="three files")) == "⋯ 3 three files"
    assert progress_line(view(progress=0, message="queued", task="t-9")) == "⋯ 0 queued (task t-9)"
    assert progress_line(view(progress=1, total=3), width=6) == "[##----]  33%"


def test_the_chat_command_takes_an_mcp_server_and_draws_its_progress(tmp_path: Path) -> None:
    pytest.importorskip("pexpect")
    from test_chat import KEY, finish, openai_args, spawn

    from kerman.providers.testing import FakeServer, Reply, ToolCall

    (tmp_path / "chat_mcp.py").write_text(
        f"import sys\nfrom kerman.mcp import MCPServer\nserver = MCPServer.stdio(sys.executable, [{SERVER!r}])\n"
    )
    environ = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", "CHAT_KEY": KEY, "PYTHONPATH": str(tmp_path), "OPENAI_API_KEY": ""}
    environ.pop("KERMAN_CHAT_DIR", None)
    with FakeServer("openai-chat", api_key=KEY) as fake:
        fake.add(Reply(tool_calls=[ToolCall("call_1", "progress", '{"steps": 4}')]), Reply(text=["counted"]))
        child = spawn(tmp_path, environ, *openai_args(fake, "--tool", "chat_mcp:server"))
        child.expect("> ")
        child.sendline("count")
        child.expect("⚙ progress")
        child.expect(r"\[#####---------------\]  25% step 1")
        child.expect(r"\[####################\] 100% step 4")
        child.expect("↳ done in 4")
        child.expect("counted")
        child.expect("> ")
        finish(child)
