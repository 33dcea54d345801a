"""What ``kerman chat`` prints for the events that change the history without a message of their
own: a compaction (``context/compacted``), a continuation (``turn/start`` with ``continues``)
and a rolled-back turn (``turn/end`` aborted with cause ``rollback``), one dim line each."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List

import kerman
from kerman import events
from kerman.cli._chat_screen import Chat
from kerman.compaction import Summarize
from kerman.models import EchoModel, ScriptedModel


def screen_of(root: Path, session_id: str) -> List[str]:
    """The chat's lines for a session, as ``Chat.catch_up`` (the renderer's path) prints them."""

    async def main() -> str:
        with kerman.FileStore(root, durability="none").open(session_id) as log:
            loop = kerman.AgentLoop(EchoModel(), log=log)
            out = io.StringIO()
            Chat(loop, out, resumed=True, echo=False).catch_up()
            await loop.aclose()
        return out.getvalue()

    return asyncio.run(main()).splitlines()


def test_a_compaction_is_one_line(tmp_path: Path) -> None:
    async def main() -> None:
        store = kerman.FileStore(tmp_path, durability="none")
        reply = [{"type": "text-delta", "text": "ok"}, {"type": "finish", "reason": "stop"}]
        loop = kerman.AgentLoop(ScriptedModel([reply, reply, reply]), log=store.create("c"))
        for text in ["q0", "q1", "q2"]:
            loop.followup(text)
            await loop.when_idle()
        await loop.compact(Summarize(ScriptedModel([kerman.ModelReply("they said q0 and q1")]), keep=1))
        await loop.aclose()
        await loop.log.aclose()

    asyncio.run(main())
    lines = screen_of(tmp_path, "c")
    compacted = [line for line in lines if "compacted" in line]
    assert len(compacted) == 1, lines
    assert compacted[0].startswith("  [context compacted: events seqs ")
    summary = '"Summary of the earlier conversation:\\nthey said q0 and q1"'  # escaped as log show escapes it
    assert compacted[0].endswith(f"summary (manual) → 1 message {summary} by ScriptedModel]")
    # It comes after the turns it summarized, where the log has it.
    assert lines.index(compacted[0]) > max(i for i, line in enumerate(lines) if line.startswith("ok"))


def test_a_rolled_back_turn_says_it_left_the_history(tmp_path: Path) -> None:
    streaming = asyncio.Event()

    async def model(request: kerman.ModelRequest) -> AsyncIterator[Dict[str, Any]]:
        yield {"type": "text-delta", "text": "Working on "}
        if request.messages[-1].text.startswith("long"):
            streaming.set()
            await asyncio.Event().wait()
        yield {"type": "text-delta", "text": "it"}
        yield {"type": "finish", "reason": "stop"}

    async def main() -> None:
        store = kerman.FileStore(tmp_path, durability="none")
        loop = kerman.AgentLoop(model, log=store.create("r"))
        loop.followup("long job")
        await streaming.wait()
        loop.followup("never mind", on_busy="rollback")
        await loop.when_idle()
        await loop.aclose()
        await loop.log.aclose()

    asyncio.run(main())
    lines = screen_of(tmp_path, "r")
    assert "  [turn 1 rolled back: out of the history from here]" in lines, lines
    assert not any("turn 1 cancelled" in line for line in lines), lines


def record(seq: int, type: str, data: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": type, "seq": seq, "time": 1000 + seq, "data": data}


def test_a_continuation_names_the_turn_it_answers() -> None:
    async def main() -> List[str]:
        loop = kerman.AgentLoop(EchoModel())
        out = io.StringIO()
        chat = Chat(loop, out, resumed=True, echo=False)
        chat.show(events.view(record(0, "turn/start", {"turn": 2, "continues": 1})))
        chat.show(events.view(record(1, "turn/start", {"turn": 3})))
        await loop.aclose()
        return out.getvalue().splitlines()

    assert asyncio.run(main()) == ["  [turn 2 continues turn 1, which a crash interrupted]"]
