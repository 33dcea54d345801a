"""Behaviour SPEC.md does not spell out, as Kerman decided it (each is listed in docs/loop.md
and in the issue notes): these tests pin the decisions."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, List

import kerman
from kerman.models import ScriptedModel


def test_options_keyword_sets_the_first_request_options() -> None:
    """Addition to SPEC 2.5: ``AgentLoop(..., options=...)`` gives ``request.options`` its
    initial value, logged in the first ``request/header``."""
    seen: List[Any] = []

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        seen.append(dict(request.options))
        return kerman.ModelReply("ok")

    async def main() -> None:
        loop = kerman.AgentLoop(model, options={"model": "m", "temperature": 0})
        loop.followup("hi")
        await loop.when_idle()
        headers = [e.data for e in loop.log.events(types="request/header")]
        assert headers == [{"options": {"model": "m", "temperature": 0}}]

    asyncio.run(main())
    assert seen == [{"model": "m", "temperature": 0}]


def test_str_tool_contexts_get_a_plugin_source_naming_the_tool() -> None:
    """SPEC 2.5 leaves the source of a ``str`` in ``additional_contexts`` open: it becomes
    ``{"kind": "plugin", "plugin": "tool:<name>"}`` (``tool`` is reserved for tool results)."""
    call = {"type": "tool-call", "id": "c1", "name": "look", "arguments": "{}"}

    async def main() -> None:
        loop = kerman.AgentLoop(ScriptedModel([kerman.ModelReply([call]), "done"]))

        @loop.tool
        async def look(args: Any, ctx: kerman.ToolContext) -> kerman.ToolResult:
            return kerman.ToolResult("found", additional_contexts=["note"])

        loop.followup("go")
        await loop.when_idle()
        entered = [e.data for e in loop.log.events(types="user/message")]
        assert entered[-1]["source"] == {"kind": "plugin", "plugin": "tool:look"}
        assert entered[-1]["content"] == [{"type": "text", "text": "note"}]

    asyncio.run(main())


def test_cancel_from_a_log_observer_aborts_even_when_discarding_fails(caplog: Any) -> None:
    """SPEC 3.8/4.4 do not say what happens when ``cancel()``'s inbox clear cannot append (from
    a log observer, appends are reentrant): the turn is still aborted, then the clear's
    ``ReentrantAppendError`` is raised to the caller (here contained and logged by the log)."""
    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        return kerman.ModelReply("never")

    async def main() -> None:
        loop = kerman.AgentLoop(model)

        def observer(event: kerman.Event) -> None:
            if event.type == "step/start":
                loop.cancel()

        loop.log.subscribe(observer)
        loop.followup("go")
        loop.inject("pending context")  # claimed at the next boundary only: the clear has work
        await loop.when_idle()
        ends = [e.data["reason"] for e in loop.log.events(types="turn/end")]
        assert ends == [{"kind": "aborted", "reason": {"kind": "user"}}]
        assert [m.text for m in loop.inbox.next_step] == ["pending context"]

    with caplog.at_level(logging.ERROR, logger="kerman"):
        asyncio.run(main())
    assert any("ReentrantAppendError" in r.getMessage() or "reenter" in r.getMessage() for r in caplog.records)
