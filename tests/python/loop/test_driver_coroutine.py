"""The turn driver is a native coroutine object (``kerman._core.Driver``, SPEC 1): it runs as the
AgentLoop's Task and follows the coroutine protocol (``send``/``throw``/``close``/``__await__``).

The turn behaviour itself is pinned by test_turns.py and test_cancel.py; these tests
pin the protocol and the cases only a coroutine object has (a throw before its first step, a
re-entrant call).
"""

from __future__ import annotations

import asyncio
import collections.abc
from typing import Any, Dict, List

import pytest

from kerman import AgentLoop, Signal
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


def by_hand(loop: AgentLoop) -> Any:
    """A driver for the loop's next turn, not run as a Task: the steps of ``_start_driver``
    (``turn/start`` and the first claim are committed) without ``create_task``."""
    loop._core.prepare(Signal())
    loop._status = "running"
    driver = loop._core.begin(loop)
    assert driver is not None
    return driver


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

        driver = by_hand(loop)
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

        driver = by_hand(loop)
        assert driver.send(None) == "suspended"
        driver.close()
        [end] = turn_ends(loop.log)
        assert end["kind"] == "error"
        assert loop.status == "idle"
        with pytest.raises(RuntimeError):
            driver.send(None)

    asyncio.run(main())


def _kerman_frames() -> List[str]:
    """The Python frames of the kerman package on the current stack."""
    import os
    import sys

    import kerman

    package = os.path.dirname(kerman.__file__)
    frame = sys._getframe(1)
    found = []
    while frame is not None:
        if frame.f_code.co_filename.startswith(package):
            found.append(frame.f_code.co_name)
        frame = frame.f_back
    return found


def test_the_step_runs_in_the_driver_without_python_frames_of_kermans_own() -> None:
    """The step (request, ``before_request``, the model call or stream, ``request_error`` and
    its retry, the assistant message) is states of the driver: user code at those seams runs
    directly under the Task, with no coroutine frame of Kerman's between."""
    from kerman import ModelError, ModelReply, Retry

    async def main() -> None:
        stacks: Dict[str, List[str]] = {}
        calls = 0

        async def reply(call: int) -> Any:
            stacks[f"model {call}"] = _kerman_frames()
            if call == 1:
                raise ModelError("overloaded", code="OVERLOADED")
            return ModelReply("hello")

        async def stream() -> Any:
            stacks["stream"] = _kerman_frames()
            yield {"type": "text-delta", "text": "hi"}

        def model(request: Any) -> Any:
            nonlocal calls
            calls += 1
            return reply(calls) if calls < 3 else stream()

        loop = AgentLoop(model)

        @loop.before_request
        async def before(request: Any, next: Any) -> Any:
            stacks[f"before_request {request.turn}"] = _kerman_frames()
            return await next()

        @loop.request_error
        async def retry(failure: Any, next: Any) -> Any:
            stacks["request_error"] = _kerman_frames()
            return Retry()

        loop.followup("one")
        await loop.when_idle()
        loop.followup("two")
        await loop.when_idle()
        assert turn_ends(loop.log) == [COMPLETED, COMPLETED]
        assert [e.data["message"]["content"] for e in loop.log.events(types="assistant/message")] == [
            [{"type": "text", "text": "hello"}],
            [{"type": "text", "text": "hi"}],
        ]
        assert sorted(stacks) == ["before_request 1", "before_request 2", "model 1", "model 2", "request_error", "stream"]
        assert all(frames == [] for frames in stacks.values()), stacks

    asyncio.run(main())


def test_driving_by_hand_passes_a_streaming_models_yields_through() -> None:
    class Suspend:
        def __await__(self) -> Any:
            got = yield "suspended"
            return got

    async def main() -> None:
        got: List[Any] = []

        async def model(request: Any) -> Any:
            got.append(await Suspend())
            yield {"type": "text-delta", "text": "a"}
            got.append(await Suspend())
            yield {"type": "text-delta", "text": "b"}

        loop = AgentLoop(model)
        loop._inbox.append("next-turn", "go")
        driver = by_hand(loop)
        assert driver.send(None) == "suspended"
        assert driver.send(1) == "suspended"
        with pytest.raises(StopIteration):
            driver.send(2)
        assert got == [1, 2]
        assert turn_ends(loop.log) == [COMPLETED]
        chunks = [e.data["chunk"]["text"] for e in loop.log.events(types="assistant/chunk")]
        assert chunks == ["a", "b"]
        [message] = [e.data["message"] for e in loop.log.events(types="assistant/message")]
        assert message["content"] == [{"type": "text", "text": "ab"}]

    asyncio.run(main())


def test_request_header_canonical_json_matches_json_dumps() -> None:
    """The options' canonical JSON is written natively for plain values and by ``json.dumps``
    for anything else (here a dict subclass): both give the same text, so alternating them
    over equal options logs no header."""
    import json

    from kerman import ModelReply

    class Options(dict):  # type: ignore[type-arg]
        pass

    values: List[Any] = [
        {},
        {"model": "m", "temperature": 0.1, "max_tokens": 2**40, "stream": True, "stop": None},
        {"b": 1, "a": 2, "B": 3, "é": 4, "😀": 5, "": 6},
        {"s": 'quote " backslash \\ nl \n cr \r tab \t bs \b ff \f nul \x00 us \x1f del \x7f'},
        {"u": "é ß 中 😀 \u2028 ~ /"},
        {"f": [0.0, -0.0, 1e16, 1e-7, 123456789.125, 1.5e300, -2.5]},
        {"n": {"z": [{"y": [[], {}]}, -1, 0], "a": {"c": {"b": "x"}}}},
        {"deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["x"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
    ]
    sequence = [v for value in values for v in (value, Options(value))]

    async def main() -> None:
        async def model(request: Any) -> Any:
            return ModelReply("ok")

        loop = AgentLoop(model)
        pending = list(sequence)

        @loop.before_request
        async def options(request: Any, next: Any) -> Any:
            request.options = pending.pop(0)
            return await next()

        for _ in sequence:
            loop.followup("go")
            await loop.when_idle()
        assert turn_ends(loop.log) == [COMPLETED] * len(sequence)
        headers = [e.data["options"] for e in loop.log.events(types="request/header")]
        assert headers == [json.loads(json.dumps(v)) for v in values]

    asyncio.run(main())


def test_an_aborted_stream_is_closed_by_awaiting_its_aclose_whatever_it_raises() -> None:
    async def main() -> None:
        streamed = asyncio.Event()
        log: List[str] = []

        class Stream:
            def __init__(self) -> None:
                self.sent = False

            async def __anext__(self) -> Any:
                if not self.sent:
                    self.sent = True
                    return {"type": "text-delta", "text": "partial"}
                streamed.set()
                await asyncio.Event().wait()

            async def aclose(self) -> None:
                log.append("closing")
                await asyncio.sleep(0)
                log.append("closed")
                raise RuntimeError("aclose failed")

        loop = AgentLoop(lambda request: Stream())
        loop.followup("go")
        await streamed.wait()
        loop.cancel("user")
        await loop.when_idle()
        assert log == ["closing", "closed"]
        assert turn_ends(loop.log) == [{"kind": "aborted", "reason": {"kind": "user"}}]
        [message] = [e.data for e in loop.log.events(types="assistant/message")]
        assert message["interrupted"] is True
        assert message["message"]["content"] == [{"type": "text", "text": "partial"}]

    asyncio.run(main())
