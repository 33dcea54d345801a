"""The turn driver is a native coroutine object (``kerman._core.Driver``, SPEC 1): it runs as the
AgentLoop's Task and follows the coroutine protocol (``send``/``throw``/``close``/``__await__``).

The turn behaviour itself is pinned by test_loop_turns.py and test_loop_cancel.py; these tests
pin the protocol and the cases only a coroutine object has (a throw before its first step, a
re-entrant call).
"""

from __future__ import annotations

import asyncio
import collections.abc
from typing import Any, Dict, List

import pytest

from kerman import AgentLoop
from kerman._core import Driver
from kerman.models import ScriptedModel

DISPOSED = {"kind": "disposed"}
COMPLETED = {"kind": "completed"}


def turn_ends(log: Any) -> List[Dict[str, Any]]:
    return [e.data["reason"] for e in log.events(types="turn/end")]


def test_the_loop_task_runs_a_driver_that_is_a_coroutine() -> None:
    async def main() -> None:
        loop = AgentLoop(ScriptedModel(["one"]))
        loop.followup("go")
        assert loop._task is not None
        driver = loop._task.get_coro()
        assert isinstance(driver, Driver)
        assert asyncio.iscoroutine(driver) and isinstance(driver, collections.abc.Coroutine)
        assert driver.__await__() is driver and iter(driver) is driver
        assert "Driver()" in repr(loop._task)
        await loop.when_idle()
        assert turn_ends(loop.log) == [COMPLETED]
        with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
            driver.send(None)
        with pytest.raises(KeyError):
            driver.throw(KeyError("x"))
        driver.close()  # closing a finished driver is a no-op

    asyncio.run(main())


def test_a_driver_cancelled_before_its_first_step_still_ends_the_turn_disposed() -> None:
    async def main() -> None:
        loop = AgentLoop(ScriptedModel(["one", "two"]))
        loop.followup("go")
        task = loop._task
        assert task is not None
        task.cancel()
        await asyncio.wait({task})
        assert task.cancelled()
        assert turn_ends(loop.log) == [{"kind": "aborted", "reason": DISPOSED}]
        assert loop.status == "idle" and loop._task is None
        loop.followup("again")
        await loop.when_idle()
        assert turn_ends(loop.log)[-1] == COMPLETED

    asyncio.run(main())


def test_a_reentrant_call_into_the_running_driver_is_refused() -> None:
    async def main() -> None:
        loop = AgentLoop(ScriptedModel(["one"]))
        seen: List[BaseException] = []

        @loop.pre_step
        async def reenter(step: Any, next: Any) -> Any:
            assert loop._task is not None
            try:
                loop._task.get_coro().send(None)
            except ValueError as exc:
                seen.append(exc)
            return await next()

        loop.followup("go")
        await loop.when_idle()
        assert [str(e) for e in seen] == ["coroutine already executing"]
        assert turn_ends(loop.log) == [COMPLETED]

    asyncio.run(main())


def test_driving_by_hand_delegates_to_the_awaited_object() -> None:
    """``send`` passes the awaited object's yields through and feeds values back into it."""

    class Suspend:
        def __await__(self) -> Any:
            got = yield "suspended"
            return got

    async def main() -> None:
        loop = AgentLoop(ScriptedModel(["one"]))
        got: List[Any] = []

        @loop.pre_step
        async def hook(step: Any, next: Any) -> Any:
            got.append(await Suspend())
            return await next()

        prefix = (loop._turn + 1, None, None)
        loop._log._append_owned("turn/start", {"turn": prefix[0]})
        loop._turn = prefix[0]
        loop._status = "running"
        driver = Driver(loop, *prefix)
        with pytest.raises(TypeError, match="just-started"):
            driver.send(1)
        assert driver.send(None) == "suspended"
        with pytest.raises(StopIteration):
            driver.send("value")
        assert got == ["value"]
        assert turn_ends(loop.log) == [COMPLETED]
        assert loop.status == "idle"

    asyncio.run(main())


def test_closing_a_suspended_driver_ends_the_turn() -> None:
    class Suspend:
        def __await__(self) -> Any:
            yield "suspended"

    async def main() -> None:
        loop = AgentLoop(ScriptedModel(["one"]))

        @loop.pre_step
        async def hook(step: Any, next: Any) -> Any:
            await Suspend()
            return await next()

        loop._log._append_owned("turn/start", {"turn": 1})
        loop._turn = 1
        loop._status = "running"
        driver = Driver(loop, 1, None, None)
        assert driver.send(None) == "suspended"
        driver.close()
        [end] = turn_ends(loop.log)
        assert end["kind"] == "error"
        assert loop.status == "idle"
        with pytest.raises(RuntimeError):
            driver.send(None)

    asyncio.run(main())
