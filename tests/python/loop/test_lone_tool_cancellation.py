"""A step's lone tool call runs in the driver's own task (python/kerman/_tools.py, ``_run_inline``),
not in a task of its own. These tests pin that it behaves exactly as a pooled call does: cancel()
reaches it, an outside cancellation still commits its result and then propagates, a tool that
cancels and returns keeps its result, a tool's own CancelledError is an aborted dispatch, and
nothing leaks into the next step (no stale cancellation, no ``_in_user``).

On Python 3.10 the lone call goes through the pool (telling an outside cancellation apart needs
``Task.cancelling()``); the assertions hold there too.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, List

import pytest

from kerman import AgentLoop, ModelReply, ToolResult
from kerman.models import ScriptedModel

ABORTED_DURING = {"name": "CancelledError", "code": "ABORTED_DURING_DISPATCH"}
ABORTED_BEFORE = {"name": "AbortError", "code": "ABORTED_BEFORE_DISPATCH"}


def call(call_id: str = "c1", name: str = "work") -> ModelReply:
    return ModelReply([{"type": "tool-call", "id": call_id, "name": name, "arguments": "{}"}])


def results(log) -> List[Any]:
    return [e for e in log.events() if e.type == "tool/result"]


def types(log) -> List[str]:
    return [e.type for e in log.events()]


def balanced(log) -> bool:
    calls = [e.seq for e in log.events() if e.type == "tool/call"]
    cited = [e.source_event_seqs for e in results(log)]
    return cited == [[seq] for seq in calls]


def test_lone_call_runs_in_the_driver_task():
    """The observable difference the fast path makes: no task of its own."""

    async def main():
        loop = AgentLoop(ScriptedModel([call(), "done"]))
        seen: List[Any] = []

        @loop.tool
        async def work(args, ctx):
            seen.append(asyncio.current_task())
            return "ok"

        loop.followup("go")
        driver = loop._task
        await loop.when_idle()
        return seen, driver

    seen, driver = asyncio.run(main())
    if sys.version_info >= (3, 11):
        assert seen == [driver]
    else:
        assert seen[0] is not driver


def test_cancel_during_a_lone_call_aborts_it_and_the_turn():
    async def main():
        loop = AgentLoop(ScriptedModel([call(), "never asked"]))
        entered = asyncio.Event()
        caught: List[str] = []

        @loop.tool
        async def work(args, ctx):
            entered.set()
            try:
                await asyncio.get_running_loop().create_future()
            except asyncio.CancelledError:
                caught.append("cancelled")
                raise

        loop.followup("go")
        await entered.wait()
        loop.cancel("user")
        await loop.when_idle()
        return loop, caught

    loop, caught = asyncio.run(main())
    assert caught == ["cancelled"]
    [result] = results(loop.log)
    assert result.data["error"] == ABORTED_DURING
    assert balanced(loop.log)
    assert types(loop.log)[-2:] == ["step/end", "turn/end"]
    assert loop.log[-1].data["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
    assert loop.status == "idle"


def test_lone_call_that_cancels_and_returns_keeps_its_result():
    async def main():
        loop = AgentLoop(ScriptedModel([call(), "never asked"]))

        @loop.tool
        async def work(args, ctx):
            ctx.loop.cancel("user")
            return "finished anyway"

        loop.followup("go")
        await loop.when_idle()
        # The pending throw was absorbed and the flag that says one is pending reset (a stale
        # flag would make the next seam swallow a cancellation that is not there).
        assert loop._thrown is False
        return loop

    loop = asyncio.run(main())
    [result] = results(loop.log)
    assert "error" not in result.data
    assert result.data["message"]["content"][0]["content"][0]["text"] == "finished anyway"
    assert loop.log[-1].type == "turn/end" and loop.log[-1].data["reason"]["kind"] == "aborted"
    assert balanced(loop.log)


def test_lone_call_raising_cancelled_error_on_its_own_is_an_aborted_dispatch_and_the_turn_goes_on():
    async def main():
        loop = AgentLoop(ScriptedModel([call(), "after the tool"]))

        @loop.tool
        async def work(args, ctx):
            raise asyncio.CancelledError()

        loop.followup("go")
        await loop.when_idle()
        return loop

    loop = asyncio.run(main())
    [result] = results(loop.log)
    assert result.data["error"] == ABORTED_DURING
    assert loop.log[-1].data["reason"] == {"kind": "completed"}
    assert [e.data["message"]["content"] for e in loop.log.events() if e.type == "assistant/message"][-1] == [
        {"type": "text", "text": "after the tool"}
    ]


def cancel_driver_during_lone_call(body):
    """Runs a turn whose lone tool call awaits forever through ``body(wait)`` and cancels the
    driver task from outside once the call has started; returns the loop and that task."""

    async def main():
        loop = AgentLoop(ScriptedModel([call(), "never asked"]))
        entered = asyncio.Event()

        async def wait():
            entered.set()
            await asyncio.get_running_loop().create_future()

        @loop.tool
        async def work(args, ctx):
            return await body(wait)

        loop.followup("go")
        driver = loop._task
        await entered.wait()
        driver.cancel()
        await asyncio.wait({driver})
        return loop, driver

    return asyncio.run(main())


def test_outside_cancellation_during_a_lone_call_commits_its_result_then_propagates():
    async def body(wait):
        await wait()

    loop, driver = cancel_driver_during_lone_call(body)
    assert driver.cancelled()
    [result] = results(loop.log)
    assert result.data["error"] == ABORTED_DURING
    assert balanced(loop.log)
    assert types(loop.log)[-2:] == ["step/end", "turn/end"]
    assert loop.log[-1].data["reason"] == {"kind": "aborted", "reason": {"kind": "disposed"}}
    assert loop.status == "idle"


def test_outside_cancellation_swallowed_by_a_lone_call_still_propagates():
    """A tool that catches the CancelledError and returns: its result is kept, but the driver
    was cancelled from outside and must still end (as the pool's ``await asyncio.wait`` would)."""

    async def body(wait):
        try:
            await wait()
        except asyncio.CancelledError:
            return ToolResult("swallowed")
        return "unreachable"

    loop, driver = cancel_driver_during_lone_call(body)
    assert driver.cancelled()
    [result] = results(loop.log)
    assert result.data["message"]["content"][0]["content"][0]["text"] == "swallowed"
    assert loop.log[-1].data["reason"] == {"kind": "aborted", "reason": {"kind": "disposed"}}


def test_cancel_before_a_lone_call_starts_gives_aborted_before_dispatch():
    """cancel() from an observer of the assistant message, after the call is known but
    before it starts: the synthetic aborted-before result, as for pooled calls."""

    async def main():
        loop = AgentLoop(ScriptedModel([call(), "never asked"]))
        ran: List[str] = []

        @loop.tool
        async def work(args, ctx):
            ran.append("ran")
            return "ok"

        def observer(event):
            if event.type == "assistant/message":
                loop.cancel("user", keep_inbox=True)

        loop.log.subscribe(observer)
        loop.followup("go")
        await loop.when_idle()
        return loop, ran

    loop, ran = asyncio.run(main())
    assert ran == []
    [result] = results(loop.log)
    assert result.data["error"] == ABORTED_BEFORE
    assert balanced(loop.log)


@pytest.mark.parametrize("durability", ["strict", "checkpoint"])
def test_cancel_after_a_lone_call_is_logged_and_before_its_barrier_gives_aborted_before(tmp_path, durability):
    """cancel() once the call is logged but before its checkpoint barrier and body: the body
    never runs and the result is the synthetic aborted-before one, as for pooled calls. (The
    cancel comes from an observer of ``tool/call``, so it lands at a known point; a cancel
    while the barrier is pending takes the same path through ``CancelledError``.)"""
    import kerman

    async def main():
        log = kerman.FileStore(tmp_path, durability=durability).create()
        loop = AgentLoop(ScriptedModel([call(), "never asked"]), log=log)
        ran: List[str] = []

        @loop.tool
        async def work(args, ctx):
            ran.append("ran")
            return "ok"

        def observer(event):
            if event.type == "tool/call":
                loop.cancel("user", keep_inbox=True)

        log.subscribe(observer)
        loop.followup("go")
        await loop.when_idle()
        await loop.aclose()
        log.close()
        return loop, ran

    loop, ran = asyncio.run(main())
    [result] = results(loop.log)
    assert balanced(loop.log)
    assert result.data["error"] == ABORTED_BEFORE
    assert ran == []
    assert loop.log[-1].data["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}


@pytest.mark.parametrize("calls", [1, 2])
def test_context_variables_a_tool_sets_stay_in_that_call(calls):
    """A tool runs in a copy of the driver's context, lone or pooled: what it sets is not
    seen by the model's next request, while what the driver's context holds is seen by the
    tool."""
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("kerman_tool_var", default="unset")
    seen_by_model: List[str] = []
    seen_by_tool: List[str] = []

    class Model:
        def __init__(self) -> None:
            self.n = 0

        async def __call__(self, request):
            seen_by_model.append(var.get())
            self.n += 1
            if self.n == 1:
                var.set("set by the model")
                return ModelReply([{"type": "tool-call", "id": f"c{i}", "name": "work", "arguments": "{}"} for i in range(calls)])
            return ModelReply("done")

    async def main():
        loop = AgentLoop(Model())

        @loop.tool
        async def work(args, ctx):
            seen_by_tool.append(var.get())
            var.set("set by the tool")
            await asyncio.sleep(0)
            return "ok"

        loop.followup("go")
        await loop.when_idle()
        return loop

    loop = asyncio.run(main())
    assert seen_by_tool == ["set by the model"] * calls
    assert seen_by_model == ["unset", "set by the model"]
    assert loop.log[-1].data["reason"] == {"kind": "completed"}
