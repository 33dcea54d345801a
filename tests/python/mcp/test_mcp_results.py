"""What an MCP call returns, as the loop logs it: every content type, structuredContent,
isError, progress, cancellation, timeouts, and a server that dies in the middle of a call."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List

from mcp_helpers import block, call, results, scripted, stdio, text, turn

import kerman
from kerman.mcp import Progress


def test_every_content_type_becomes_blocks_the_providers_understand() -> None:
    async def main() -> None:
        loop = kerman.AgentLoop(scripted(call("media", {}), "done"), tools=[stdio()])
        await turn(loop)
        [event] = results(loop)
        content = block(event)["content"]
        assert [b["type"] for b in content] == ["text", "image", "text", "text", "text"]
        assert content[0]["text"] == "hello"
        assert content[1] == {"type": "image", "mediaType": "image/png", "data": "iVBORw0KGgotcGl4ZWwt"}
        assert content[2]["text"] == "[audio (audio/wav), 10 bytes, not shown]"
        assert content[3]["text"] == "[resource memo://one (text/plain)]\nembedded text"
        assert content[4]["text"] == "[resource link two <memo://two> (text/plain)]"
        mcp = event.data["meta"]["mcp"]
        assert mcp["structuredContent"] == {"answer": 42}
        assert mcp["media"] == [{"type": "audio", "mimeType": "audio/wav", "bytes": 10}]
        assert (mcp["server"], mcp["tool"]) == ("mcp_server.py", "media")
        assert not block(event).get("isError", False)
        await loop.aclose()

    asyncio.run(main())


def test_a_result_of_one_text_block_is_given_to_the_loop_as_its_text() -> None:
    # The loop logs a str result as one text block built straight as JSON; a list of blocks
    # it keeps as parsed maps (a few times the memory): the commonest MCP result is the former.
    async def main() -> None:
        server = stdio(filter=["add"])
        [tool] = await server.list_tools()
        ctx = SimpleNamespace(call_id="c1", turn=1, step=1, input=None, loop=None)
        result = await tool.fn({"a": 1, "b": 2}, ctx)
        assert result.content == "3"
        assert result.meta["mcp"]["structuredContent"] == {"result": "3"}
        await server.aclose()
        loop = kerman.AgentLoop(scripted(call("add", {"a": 1, "b": 2}), "done"), tools=[stdio(filter=["add"])])
        await turn(loop)
        [event] = results(loop)
        assert block(event)["content"] == [{"type": "text", "text": "3"}]
        assert "isError" not in block(event)
        await loop.aclose()

    asyncio.run(main())


def test_is_error_becomes_an_error_result() -> None:
    async def main() -> None:
        loop = kerman.AgentLoop(scripted(call("fail", {"reason": "no disk"}), "done"), tools=[stdio()])
        await turn(loop)
        [event] = results(loop)
        assert block(event)["isError"] is True
        assert text(event) == "failed: no disk"
        await loop.aclose()

    asyncio.run(main())


def test_progress_reaches_on_progress_and_the_log() -> None:
    async def main() -> None:
        seen: List[Progress] = []
        loop = kerman.AgentLoop(scripted(call("progress", {"steps": 2}), "done"), tools=[stdio(on_progress=seen.append)])
        await turn(loop)
        [event] = results(loop)
        assert text(event) == "done in 2"
        assert [(p.tool, p.call_id, p.progress, p.total, p.message) for p in seen] == [
            ("progress", "c1", 1.0, 2.0, "step 1"),
            ("progress", "c1", 2.0, 2.0, "step 2"),
        ]
        assert event.data["meta"]["mcp"]["progress"] == [
            {"progress": 1.0, "total": 2.0, "message": "step 1"},
            {"progress": 2.0, "total": 2.0, "message": "step 2"},
        ]
        await loop.aclose()

    asyncio.run(main())


def _wait_for_line(path: Path, line: str, within: float = 20.0) -> List[str]:
    """The lines the server process wrote to ``path``, once ``line`` is among them (it is
    another process: its file is the only thing to wait on)."""
    deadline = time.monotonic() + within
    while True:
        lines = path.read_text().split() if path.exists() else []
        if line in lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


def test_cancelling_the_turn_cancels_the_call_on_the_server(tmp_path: Path) -> None:
    marker = tmp_path / "marker"

    async def main() -> None:
        loop: Any = None

        def on_progress(update: Progress) -> None:
            loop.cancel()  # the call is running on the server: cancel the turn

        server = stdio(env={"KERMAN_MCP_MARKER": str(marker)}, on_progress=on_progress)
        loop = kerman.AgentLoop(scripted(call("slow", {"steps": 1}), "unused"), tools=[server])
        await turn(loop)
        [event] = results(loop)
        assert block(event)["isError"] is True
        ends = [e for e in loop.log.events() if e.type == "turn/end"]
        assert ends[-1].data["reason"]["kind"] == "aborted", ends[-1].data
        assert _wait_for_line(marker, "cancelled") == ["started", "cancelled"]
        await loop.aclose()

    asyncio.run(main())


def test_a_call_past_the_server_timeout_gets_an_error_and_the_server_a_cancellation(tmp_path: Path) -> None:
    marker = tmp_path / "marker"

    async def main() -> None:
        server = stdio(env={"KERMAN_MCP_MARKER": str(marker)}, timeout=0.5)
        loop = kerman.AgentLoop(scripted(call("slow", {"steps": 0}), "done"), tools=[server])
        await turn(loop)
        [event] = results(loop)
        assert block(event)["isError"] is True
        assert "timeout of 0.5s" in text(event)
        assert _wait_for_line(marker, "cancelled") == ["started", "cancelled"]
        await loop.aclose()

    asyncio.run(main())


def test_a_server_that_dies_mid_call_gives_an_error_and_is_started_again() -> None:
    async def main() -> None:
        server = stdio()
        model = scripted(call("crash", {}), "it crashed", call("add", {"a": 2, "b": 3}, "c2"), "done")
        loop = kerman.AgentLoop(model, tools=[server])
        await turn(loop)
        [crashed] = results(loop)
        assert block(crashed)["isError"] is True
        assert "the server stopped during the call" in text(crashed)
        assert "started again" in text(crashed)
        await turn(loop, "again")
        assert text(results(loop)[1]) == "5"
        assert server.starts == 2
        await loop.aclose()

    asyncio.run(main())
