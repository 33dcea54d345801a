"""``SessionLog.tail()`` as the native ``LogTail``: what its own async iterator protocol could get
wrong (the behaviour shared with the generator it replaced is pinned in test_log.py).

A cancelled ``__anext__`` gives its wait up and loses no event, so the next one carries on.
(A deliberate change from the async generator it replaced, which a cancellation finished for
good, so every later ``anext`` raised ``StopAsyncIteration``; SPEC is silent on it.)
the tail and a suspended ``__anext__`` take part in the garbage collector; a finished or
closed tail lets its log go.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any, List

import pytest

import kerman


def test_tail_is_a_native_async_iterator(log):
    tail = log.tail()
    assert isinstance(tail, kerman._core.LogTail)
    assert tail.__aiter__() is tail
    log.append("x/a", 0)
    log.close()

    async def main() -> List[int]:
        return [event.seq async for event in tail]

    assert asyncio.run(main()) == [0]


def test_anext_cancelled_mid_wait_then_continued_gets_every_event_once(log):
    async def main() -> List[int]:
        tail = log.tail(types="x/keep")
        got: List[int] = []
        for round in range(20):
            # Parked: nothing to read. The timeout cancels the wait.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(tail.__anext__(), 0.001)
            await asyncio.sleep(0)  # the cancelled future's done callback runs
            assert log._waiting() == 0
            log.append("x/skip", round)
            log.append("x/keep", round)
            log.append("x/keep", round)
            got.append((await tail.__anext__()).seq)
            # The second was read with the first: it is handed out without a wait.
            got.append((await asyncio.wait_for(tail.__anext__(), 5)).seq)
        log.close()
        got.extend([event.seq async for event in tail])
        return got

    got = asyncio.run(asyncio.wait_for(main(), 60))
    assert got == [seq for r in range(20) for seq in (3 * r + 1, 3 * r + 2)]
    assert log._waiting() == 0


def test_a_cancel_that_races_the_wake_up_loses_nothing(log):
    """The wait completes (an append) and the task is cancelled before it runs again: the
    event is not consumed by the cancelled ``__anext__``."""

    async def main() -> List[int]:
        tail = log.tail()
        task = asyncio.ensure_future(tail.__anext__())
        await asyncio.sleep(0)  # the task is parked on the wait
        assert log._waiting() == 1
        log.append("x/a", 0)  # completes the wait ...
        task.cancel()  # ... and the task is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await task
        log.append("x/a", 1)
        log.close()
        return [event.seq async for event in tail]

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [0, 1]


def test_closing_a_suspended_anext_gives_its_wait_up(log):
    async def main() -> None:
        tail = log.tail()

        async def reader() -> Any:
            return await tail.__anext__()

        coro = reader()
        future = coro.send(None)  # suspended on the log's wait: the future is what it yields
        assert isinstance(future, asyncio.Future)
        assert log._waiting() == 1
        coro.close()
        assert future.cancelled()
        await asyncio.sleep(0)
        assert log._waiting() == 0
        # The tail itself is still usable.
        log.append("x/a", 0)
        assert (await tail.__anext__()).seq == 0

    asyncio.run(asyncio.wait_for(main(), 30))


def test_an_awaited_anext_cannot_be_awaited_again(log):
    log.append("x/a", 0)

    async def main() -> None:
        step = log.tail().__anext__()
        assert (await step).seq == 0
        with pytest.raises(RuntimeError):
            await step

    asyncio.run(main())


def test_aclose_ends_the_tail_and_lets_the_log_go():
    log = kerman.MemoryStore().create()
    log.append("x/a", 0)
    log.append("x/a", 1)
    ref = weakref.ref(log)

    async def main(tail: Any) -> List[int]:
        got = [(await tail.__anext__()).seq]
        assert await tail.aclose() is None
        with pytest.raises(StopAsyncIteration):
            await tail.__anext__()
        await tail.aclose()  # idempotent
        return got

    tail = log.tail()
    del log
    assert asyncio.run(main(tail)) == [0]
    gc.collect()
    assert ref() is None


def test_an_ended_tail_lets_the_log_go():
    log = kerman.MemoryStore().create()
    log.append("x/a", 0)
    log.close()
    ref = weakref.ref(log)
    tail = log.tail()
    del log

    async def main() -> List[int]:
        return [event.seq async for event in tail]

    assert asyncio.run(main()) == [0]
    gc.collect()
    assert ref() is None

    async def again() -> None:
        with pytest.raises(StopAsyncIteration):
            await tail.__anext__()

    asyncio.run(again())


def test_tail_in_a_cycle_is_collected():
    """log -> observer -> tail -> log, and the same through an ``__anext__``."""
    log = kerman.MemoryStore().create()
    tail = log.tail()
    step = tail.__anext__()
    log.subscribe(lambda event, t=tail, s=step: None)
    ref = weakref.ref(log)
    del log, tail, step
    gc.collect()
    assert ref() is None


def test_a_suspended_anext_shows_the_collector_what_it_holds():
    """Parked on its wait, an ``__anext__`` holds the future and its ``__await__`` iterator
    (and the tail, which holds the log): the collector sees them all, and once dropped they go."""
    log = kerman.MemoryStore().create()
    refs: List[weakref.ref[Any]] = [weakref.ref(log)]

    async def main(log: kerman.SessionLog) -> None:
        tail = log.tail()
        step = tail.__anext__()
        future = step.__await__().send(None)  # type: ignore[attr-defined]
        held = [o for o in gc.get_referents(step) if not isinstance(o, type)]
        assert held[:2] == [tail, future] and len(held) == 3  # and the future's iterator
        assert [o for o in gc.get_referents(tail) if not isinstance(o, type)] == [log]
        refs.append(weakref.ref(future))
        future.add_done_callback(lambda f, s=step: None)  # a cycle through the future
        future.cancel()
        await asyncio.sleep(0)
        assert log._waiting() == 0

    asyncio.run(main(log))
    del log
    gc.collect()
    assert [r for r in refs if r() is not None] == []
