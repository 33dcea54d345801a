"""Every awaitable the binding writes in Rust follows one coroutine protocol and one
cancellation rule (``src/python/runtime/coroutine.rs``): ``throw(exc)`` raises ``exc`` where the
awaitable is suspended (into the object it awaits, if any), and the awaitable stops that work and
re-raises or finishes; thrown into a finished awaitable, the exception is raised as it is;
``close()`` stops it and returns ``None``; a task cancelled while awaiting it gets the
``CancelledError`` through the same ``throw``.

The awaitables: ``Ready`` (a waterfall's finished ``next()``), ``LogTailStep`` (one
``LogTail.__anext__``), ``Driver`` (the AgentLoop's task) and ``_InContext`` (a lone tool body,
resumed in its own context, which the driver awaits).
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from typing import Any, Dict, List

import pytest

from kerman import NEXT_TURN, AgentLoop, MemoryStore, ModelReply, Signal
from kerman._core import Driver, Next, Ready
from kerman.models import ScriptedModel

# ---- Ready ------------------------------------------------------------------------------------


def ready(value: Any) -> Any:
    step = Next([], None, lambda: value)()
    assert isinstance(step, Ready)
    return step


def test_ready_gives_its_value_at_the_first_step() -> None:
    step = ready(5)
    assert step.__await__() is step
    with pytest.raises(StopIteration) as stop:
        step.send(None)
    assert stop.value.value == 5


def test_a_throw_into_ready_raises_and_drops_its_value() -> None:
    step = ready(5)
    with pytest.raises(KeyError, match="k"):
        step.throw(KeyError("k"))
    with pytest.raises(StopIteration) as stop:
        step.send(None)
    assert stop.value.value is None


def test_ready_reads_throws_arguments_as_generator_throw_does() -> None:
    with pytest.raises(KeyError) as raised:
        ready(5).throw(KeyError, "k")
    assert raised.value.args == ("k",)
    with pytest.raises(ValueError) as raised_tuple:
        ready(5).throw(ValueError, ("a", "b"))
    assert raised_tuple.value.args == ("a", "b")
    with pytest.raises(TypeError, match="instance exception may not have a separate value"):
        ready(5).throw(KeyError("k"), "v")
    with pytest.raises(TypeError, match="deriving from BaseException"):
        ready(5).throw(42)


def test_closing_ready_drops_its_value() -> None:
    step = ready(5)
    assert step.close() is None
    with pytest.raises(StopIteration) as stop:
        step.send(None)
    assert stop.value.value is None


def test_await_reads_ready_as_send_does_traced_or_not() -> None:
    """``await`` asks ``Ready``'s ``am_send`` slot (no ``StopIteration`` made); a tracer makes
    CPython 3.11 take ``__next__`` instead. Either way: the value once, then ``None``."""

    async def twice(step: Any) -> List[Any]:
        return [await step, await step]

    def run(coro: Any) -> Any:
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        raise AssertionError("Ready suspended")

    closed = ready("gone")
    closed.close()
    assert run(twice(ready("v"))) == ["v", None]
    assert run(twice(closed)) == [None, None]
    before = sys.gettrace()
    sys.settrace(lambda frame, event, arg: None)
    try:
        assert run(twice(ready("v"))) == ["v", None]
    finally:
        sys.settrace(before)


def test_a_task_cancelled_before_it_awaits_ready_never_reads_it() -> None:
    """``Ready`` never suspends: a task can only be cancelled before or after awaiting it."""

    async def main() -> List[str]:
        seen: List[str] = []

        async def body() -> None:
            seen.append(str(await ready("v")))

        task = asyncio.ensure_future(body())
        task.cancel()
        await asyncio.wait({task})
        assert task.cancelled()
        return seen

    assert asyncio.run(main()) == []


# ---- LogTailStep ------------------------------------------------------------------------------


def test_a_throw_into_a_waiting_tail_step_gives_its_wait_up_and_loses_no_event() -> None:
    async def main() -> None:
        log = MemoryStore().create()
        tail = log.tail()
        step = tail.__anext__()
        waited = step.send(None)
        assert isinstance(waited, asyncio.Future)
        with pytest.raises(KeyError, match="k"):
            step.throw(KeyError("k"))
        assert waited.cancelled()
        # Finished: a throw is raised as it is, a send refused.
        with pytest.raises(LookupError, match="again"):
            step.throw(LookupError("again"))
        with pytest.raises(RuntimeError, match="cannot reuse"):
            step.send(None)
        log.append("x/y", {"n": 1})
        event = await tail.__anext__()
        assert (event.type, event.data) == ("x/y", {"n": 1})
        await tail.aclose()

    asyncio.run(main())


def test_closing_a_waiting_tail_step_gives_its_wait_up_and_loses_no_event() -> None:
    async def main() -> None:
        log = MemoryStore().create()
        tail = log.tail()
        step = tail.__anext__()
        waited = step.send(None)
        assert step.close() is None
        assert waited.cancelled()
        assert step.close() is None  # closing a finished step does nothing
        log.append("x/y", {"n": 2})
        event = await tail.__anext__()
        assert event.data == {"n": 2}
        await tail.aclose()

    asyncio.run(main())


def test_a_task_cancelled_while_awaiting_a_tail_step_is_cancelled_and_loses_no_event() -> None:
    async def main() -> None:
        log = MemoryStore().create()
        tail = log.tail()
        waiting = asyncio.Event()

        async def next_event() -> Any:
            waiting.set()
            return await tail.__anext__()

        task = asyncio.ensure_future(next_event())
        await waiting.wait()
        task.cancel()
        await asyncio.wait({task})
        assert task.cancelled()
        log.append("x/y", {"n": 3})
        event = await tail.__anext__()
        assert event.data == {"n": 3}
        await tail.aclose()

    asyncio.run(main())


# ---- Driver -----------------------------------------------------------------------------------


def turn_ends(log: Any) -> List[Dict[str, Any]]:
    return [e.data["reason"] for e in log.events(types="turn/end")]


def by_hand(loop: AgentLoop) -> Any:
    """A driver for the loop's next turn, not run as a Task (as ``_start_driver`` makes it)."""
    loop._core.prepare(Signal())
    loop._status = "running"
    driver = loop._core.begin(loop)
    assert isinstance(driver, Driver)
    return driver


class Suspend:
    """Suspends once, recording what is thrown into it and whether it was closed."""

    def __init__(self, seen: List[str]) -> None:
        self.seen = seen

    def __await__(self) -> Any:
        try:
            yield "suspended"
        except GeneratorExit:
            self.seen.append("closed")
            raise
        except BaseException as exc:
            self.seen.append(f"thrown {type(exc).__name__}")
            raise


def suspended_driver(seen: List[str]) -> Any:
    loop = AgentLoop(ScriptedModel(["one"]))

    @loop.pre_step
    async def hook(step: Any, next: Any) -> Any:
        await Suspend(seen)
        return await next()

    driver = by_hand(loop)
    assert driver.send(None) == "suspended"
    return loop, driver


def test_a_throw_into_a_driver_goes_into_the_awaited_object_and_the_turn_ends() -> None:
    async def main() -> None:
        seen: List[str] = []
        loop, driver = suspended_driver(seen)
        with pytest.raises(StopIteration):
            driver.throw(KeyError, "k")
        assert seen == ["thrown KeyError"]
        [end] = turn_ends(loop.log)
        assert end["kind"] == "error"
        assert loop.status == "idle"
        with pytest.raises(KeyError):
            driver.throw(KeyError("after"))

    asyncio.run(main())


def test_closing_a_driver_closes_the_awaited_object() -> None:
    async def main() -> None:
        seen: List[str] = []
        loop, driver = suspended_driver(seen)
        assert driver.close() is None
        assert seen == ["closed"]
        assert loop.status == "idle"
        assert driver.close() is None

    asyncio.run(main())


def test_closing_a_driver_that_never_started_runs_nothing() -> None:
    async def main() -> None:
        seen: List[str] = []
        loop = AgentLoop(ScriptedModel(["one"]))

        @loop.pre_step
        async def hook(step: Any, next: Any) -> Any:
            seen.append("ran")
            return await next()

        driver = by_hand(loop)
        assert driver.close() is None
        assert seen == []
        with pytest.raises(RuntimeError, match="cannot reuse"):
            driver.send(None)

    asyncio.run(main())


def test_a_task_cancelled_while_its_driver_awaits_user_code_throws_into_that_code() -> None:
    async def main() -> None:
        loop = AgentLoop(ScriptedModel(["one"]))
        entered = asyncio.Event()
        seen: List[str] = []

        @loop.pre_step
        async def hook(step: Any, next: Any) -> Any:
            entered.set()
            try:
                await asyncio.get_running_loop().create_future()
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            return await next()

        loop.followup("go")
        task = loop._task
        assert task is not None
        await entered.wait()
        task.cancel()
        await asyncio.wait({task})
        assert task.cancelled()
        assert seen == ["cancelled"]
        assert turn_ends(loop.log) == [{"kind": "aborted", "reason": {"kind": "disposed"}}]
        assert loop.status == "idle"

    asyncio.run(main())


# ---- _InContext: a lone tool body -------------------------------------------------------------

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="outside")


def call() -> ModelReply:
    return ModelReply([{"type": "tool-call", "id": "c1", "name": "work", "arguments": "{}"}])


def lone_call_loop(seen: List[str], entered: asyncio.Event) -> AgentLoop:
    """A loop whose lone tool call sets a context variable, then waits forever; what reaches
    the body is recorded with the variable's value where it lands. Its input is queued, not
    yet run."""
    loop = AgentLoop(ScriptedModel([call(), "after the tool"]))
    loop.send("go", NEXT_TURN, False)

    @loop.tool
    async def work(args: Any, ctx: Any) -> str:
        VAR.set("in the body")
        entered.set()
        try:
            await asyncio.get_running_loop().create_future()
        except GeneratorExit:
            seen.append(f"closed {VAR.get()}")
            raise
        except BaseException as exc:
            seen.append(f"thrown {type(exc).__name__} {VAR.get()}")
            raise
        return "unreachable"

    return loop


def in_context(driver: Any) -> Any:
    """The driver's first yield while its lone tool body waits: the body's future (the driver
    awaits the body through an ``_InContext``)."""
    return driver.send(None)


def test_a_throw_into_a_driver_in_a_lone_call_lands_in_the_body_in_its_context() -> None:
    async def main() -> None:
        seen: List[str] = []
        loop = lone_call_loop(seen, asyncio.Event())
        driver = by_hand(loop)
        waited = in_context(driver)
        assert isinstance(waited, asyncio.Future)
        try:
            while True:
                step = driver.throw(KeyError("k")) if not seen else driver.send(None)
                assert step is not None
        except StopIteration:
            pass
        assert seen == ["thrown KeyError in the body"]
        assert VAR.get() == "outside"
        [result] = [e for e in loop.log.events() if e.type == "tool/result"]
        assert result.data["error"]["name"] == "KeyError"

    asyncio.run(main())


def test_closing_a_driver_in_a_lone_call_closes_the_body_in_its_context() -> None:
    async def main() -> None:
        seen: List[str] = []
        loop = lone_call_loop(seen, asyncio.Event())
        driver = by_hand(loop)
        in_context(driver)
        assert driver.close() is None
        assert seen == ["closed in the body"]
        assert VAR.get() == "outside"
        assert loop.status == "idle"

    asyncio.run(main())


def test_a_task_cancelled_in_a_lone_call_throws_into_the_body_in_its_context() -> None:
    async def main() -> None:
        seen: List[str] = []
        entered = asyncio.Event()
        loop = lone_call_loop(seen, entered)
        loop.followup("wake up")
        task = loop._task
        assert task is not None
        await entered.wait()
        task.cancel()
        await asyncio.wait({task})
        assert task.cancelled()
        assert seen == ["thrown CancelledError in the body"]
        assert VAR.get() == "outside"
        assert loop.status == "idle"

    asyncio.run(main())
