"""What ``kerman chat`` prints for a session, pinned: the renderer (``Chat.catch_up``, the path
``log.tail()`` takes too) and a resumed session's banner, over a log a real loop wrote (a
streamed reply with reasoning and a tool call, a failed tool, a steer and a plugin's context,
a failed turn, a rejected one)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any, AsyncIterator, Dict

import kerman
from kerman.cli._chat_screen import Chat
from kerman.hooks import Reject
from kerman.models import EchoModel

SCREEN = """\
  » prompt: read a.txt
thinkingLet me look.
  ⚙ read({"path": "a.txt"})
  ✗ no such file: a.txt
  » steer: only the python files
  » plugin: workspace: 3 files
Done.
  » prompt: fail please
  [turn 2 error: rate limited [RATE_LIMITED]]
  [turn 3 {"kind": "blocked", "reason": "needs a human"}]
  rejected before it was read: rm -rf / — /resend 3 sends it again
"""

BANNER = """\
resumed session chat (ID events)
  you: only the python files
  you: workspace: 3 files
  agent: Done.
  you: fail please
model EchoModel() · store <ROOT> · /help for commands
  rejected before it was read: rm -rf / — /resend 3 sends it again
"""


async def model(request: kerman.ModelRequest) -> AsyncIterator[Dict[str, Any]]:
    said = " ".join(m.text for m in request.entered)
    if "fail" in said:
        raise kerman.ModelError("rate limited", code="RATE_LIMITED", status=429)
    if request.step == 1:
        yield {"type": "reasoning-delta", "text": "thinking"}
        yield {"type": "text-delta", "text": "Let me look."}
        yield {"type": "tool-call", "id": "c1", "name": "read", "arguments": '{"path": "a.txt"}'}
    else:
        yield {"type": "text-delta", "text": "Done."}
    yield {"type": "finish", "reason": "stop"}


def write_session(root: Path) -> None:
    async def main() -> None:
        store = kerman.FileStore(root, durability="none")
        log = store.create("chat")
        loop = kerman.AgentLoop(model, log=log)

        @loop.tool
        async def read(path: str) -> str:
            """Reads a file."""
            loop.steer("only the python files")
            loop.inject(kerman.UserMessage("workspace: 3 files", source={"kind": "plugin", "plugin": "ws"}))
            raise FileNotFoundError(f"no such file: {path}")

        @loop.pre_step
        async def guard(step: Any, next: Any) -> Any:
            if any("rm -rf" in m.text for m in step.messages):
                return Reject("needs a human")
            return await next()

        for prompt in ("read a.txt", "fail please", "rm -rf /"):
            loop.followup(prompt)
            await loop.when_idle()
        await loop.aclose()
        await log.aclose()

    asyncio.run(main())


def test_the_screen_of_a_session(tmp_path: Path) -> None:
    write_session(tmp_path)

    async def main() -> tuple[str, str]:
        store = kerman.FileStore(tmp_path, durability="none")
        log = store.open("chat")
        loop = kerman.AgentLoop(EchoModel(), log=log)
        out = io.StringIO()
        chat = Chat(loop, out, resumed=True, echo=False)
        chat.catch_up()
        screen = out.getvalue()
        out.seek(0)
        out.truncate()
        chat.banner(log, EchoModel(), store)
        banner = out.getvalue().replace(str(store.root), "<ROOT>").replace(f"({len(log)} events)", "(ID events)")
        await loop.aclose()
        await log.aclose()
        return screen, banner

    screen, banner = asyncio.run(main())
    assert screen == SCREEN
    assert banner == BANNER
