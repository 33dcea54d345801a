"""MCP progress notifications as ``tool/progress`` records: logged for the running call against
the real test server, shown by both UI streams, and coalesced by the rule of docs/mcp.md
("Progress"), checked with an injected clock."""

from __future__ import annotations

import asyncio
from typing import List, Optional

import pytest
from mcp_helpers import call, results, scripted, stdio, turn

import kerman
from kerman import events
from kerman.mcp import Progress
from kerman.mcp._progress import INTERVAL, Coalescer
from kerman.ui import agui, vercel


def _progress(loop: kerman.AgentLoop) -> List[events.ToolProgress]:
    return [v for v in events.views(loop.log.events()) if isinstance(v, events.ToolProgress)]


def test_each_update_of_the_real_server_is_logged_for_the_running_call() -> None:
    async def main() -> None:
        seen: List[Progress] = []
        loop = kerman.AgentLoop(scripted(call("progress", {"steps": 3}), "done"), tools=[stdio(on_progress=seen.append)])
        await turn(loop)
        logged = _progress(loop)
        # each message differs, so each update is logged, in order, between the call and its result
        assert [(v.turn, v.step, v.call_id, v.progress, v.total, v.message) for v in logged] == [
            (1, 1, "c1", 1, 3, "step 1"),
            (1, 1, "c1", 2, 3, "step 2"),
            (1, 1, "c1", 3, 3, "step 3"),
        ]
        assert logged[0].data == {"turn": 1, "step": 1, "callId": "c1", "progress": 1, "total": 3, "message": "step 1"}
        [call_event] = [e for e in loop.log.events() if e.type == "tool/call"]
        [result] = results(loop)
        assert call_event.seq < logged[0].seq and logged[-1].seq < result.seq
        assert len(seen) == 3 and len(result.data["meta"]["mcp"]["progress"]) == 3

        agui_progress = [u.data for u in agui(loop.log.events()) if u.data.get("name") == "kerman.tool/progress"]
        assert [(d["type"], d["value"]["progress"], d["value"]["message"]) for d in agui_progress] == [
            ("CUSTOM", 1, "step 1"),
            ("CUSTOM", 2, "step 2"),
            ("CUSTOM", 3, "step 3"),
        ]
        parts = [u.data for u in vercel(loop.log.events()) if u.data["type"] == "data-tool-progress"]
        assert [(p["id"], p["transient"], p["data"]["progress"]) for p in parts] == [
            ("progress-c1", True, 1),
            ("progress-c1", True, 2),
            ("progress-c1", True, 3),
        ]
        await loop.aclose()

    asyncio.run(main())


def test_a_frozen_clock_logs_the_first_update_and_every_message_change_only() -> None:
    async def main() -> None:
        seen: List[Progress] = []
        server = stdio(on_progress=seen.append)
        server._clock = lambda: 100.0  # no time passes between the server's updates
        loop = kerman.AgentLoop(scripted(call("progress_same", {"steps": 4}), "done"), tools=[server])
        await turn(loop)
        # four updates of one message: the first, and the one reaching its total
        assert [(v.progress, v.total, v.message) for v in _progress(loop)] == [(1, 4, "working"), (4, 4, "working")]
        assert [p.progress for p in seen] == [1, 2, 3, 4]
        [result] = results(loop)
        assert [p["progress"] for p in result.data["meta"]["mcp"]["progress"]] == [1, 2, 3, 4]
        await loop.aclose()

    asyncio.run(main())


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "updates, logged",
    [
        # (time, progress, total, message) ...; the indexes of the logged ones
        ([(0.0, 1, None, None), (0.1, 2, None, None), (0.2, 3, None, None), (0.25, 4, None, None)], [0, 3]),
        ([(0.0, 1, 10, "a"), (0.01, 2, 10, "b"), (0.02, 3, 10, "b"), (0.03, 10, 10, "b")], [0, 1, 3]),
        ([(5.0, 1, 2, "x"), (5.1, 2, 2, "x"), (5.2, 3, 2, "x")], [0, 1, 2]),  # at or past the total
        ([(0.0, 1, None, "x"), (0.3, 2, None, "x"), (0.4, 3, None, "x"), (0.55, 4, None, "x")], [0, 1, 3]),
        ([(0.0, 1, None, "x"), (0.1, 2, None, None)], [0, 1]),  # a message dropped is a change
    ],
    ids=["interval", "message-change-and-total", "total", "interval-from-last-logged", "message-dropped"],
)
def test_the_coalescing_rule(updates: list, logged: List[int]) -> None:
    clock = _Clock()
    rule = Coalescer(clock)
    got = []
    for i, (now, progress, total, message) in enumerate(updates):
        clock.now = now
        if rule.admit(progress, total, message):
            got.append(i)
    assert got == logged
    assert INTERVAL == 0.25


def test_record_progress_refuses_bad_numbers() -> None:
    loop = kerman.AgentLoop(scripted("done"))
    with pytest.raises(ValueError, match="progress must be a finite number, got NaN"):
        loop._core.record_progress(1, 1, "c1", float("nan"))
    with pytest.raises(ValueError, match="tool/progress needs a call id"):
        loop._core.record_progress(1, 1, "", 1.0)
    seq = loop._core.record_progress(1, 1, "c1", 0.5, None, "half")
    [event] = [e for e in loop.log.events() if e.seq == seq]
    assert (event.type, event.data) == ("tool/progress", {"turn": 1, "step": 1, "callId": "c1", "progress": 0.5, "message": "half"})
    view: Optional[events.EventView] = events.view(event)
    assert isinstance(view, events.ToolProgress) and view.total is None and view.fraction is None
