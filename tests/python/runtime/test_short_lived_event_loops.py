"""Short-lived event loops and cancelled waits leak nothing (issue 12, item 11): a completion
delivered to a closed loop is dropped, loops ending with a flush pending leak no descriptor and
no loop, and tail waits cancelled (in their loop or another) are dropped at once. No test
sleeps or measures time."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import weakref
from typing import Any, List

import pytest

from kerman import FileStore, MemoryStore

# ---- item 11: short-lived event loops and cancelled waits leak nothing --------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")


def loop_factories() -> List[Any]:
    factories: List[Any] = [asyncio.new_event_loop]
    try:
        import uvloop

        factories.append(uvloop.new_event_loop)
    except ImportError:
        pass
    return factories


def run_short_lived(factory: Any, coro_fn: Any, rounds: int) -> List[Any]:
    """Runs ``coro_fn(i)`` on ``rounds`` fresh loops, each closed after; weak references to them."""
    refs = []
    for i in range(rounds):
        loop = factory()
        try:
            loop.run_until_complete(coro_fn(i))
        finally:
            loop.close()
        refs.append(weakref.ref(loop))
        del loop
    return refs


@needs_proc
@pytest.mark.parametrize("factory", loop_factories(), ids=lambda f: f.__module__.split(".")[0])
def test_a_completion_delivered_to_a_closed_loop_is_dropped(factory):
    """A wait completed from another thread after its loop closed (as a flush that finishes
    after the loop ended): the loop, its future and its drain's pipe all go."""
    log = MemoryStore().create()
    run_short_lived(factory, lambda i: asyncio.sleep(0), 1)  # warm up
    gc.collect()
    before = open_fds()

    async def leave_a_wait(i: int) -> None:
        assert not log._grown(len(log)).done()

    def append() -> None:
        log.append("x/event", {})

    refs = []
    for _ in range(20):
        refs += run_short_lived(factory, leave_a_wait, 1)
        thread = threading.Thread(target=append)  # delivers on a thread that is not the loop's
        thread.start()
        thread.join()
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    assert open_fds() == before
    log.close()


@needs_proc
@pytest.mark.parametrize("factory", loop_factories(), ids=lambda f: f.__module__.split(".")[0])
def test_loops_ending_with_a_flush_pending_leak_nothing(tmp_path, factory):
    store = FileStore(tmp_path, durability="strict")
    run_short_lived(factory, lambda i: asyncio.sleep(0), 1)
    gc.collect()
    before = open_fds()
    log = store.create("s")

    async def flush_and_leave(i: int) -> None:
        log.append("x/event", {"i": i})
        log.flush()  # not awaited: the loop ends with it pending (or just delivered)

    refs = run_short_lived(factory, flush_and_leave, 50)
    log.close()  # every flush completed
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    assert open_fds() == before


@needs_proc
@pytest.mark.parametrize("factory", loop_factories(), ids=lambda f: f.__module__.split(".")[0])
def test_a_tail_wait_cancelled_in_another_loop_is_dropped(factory):
    log = MemoryStore().create()
    log.append("x/event", {})
    run_short_lived(factory, lambda i: asyncio.sleep(0), 1)
    gc.collect()
    before = open_fds()

    async def time_out(i: int) -> None:
        tail = log.tail(start=len(log))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(tail.__anext__(), 0.01)  # nothing is appended: it times out
        await tail.aclose()

    refs = run_short_lived(factory, time_out, 20)
    gc.collect()
    assert log._waiting() == 0
    assert [r for r in refs if r() is not None] == []
    assert open_fds() == before
    log.close()


def test_cancelled_tail_waits_are_dropped_at_once():
    """Within one loop: a cancelled wait is given up when cancelled, not kept (with its future)
    until the next append."""
    log = MemoryStore().create()

    async def main() -> None:
        refs = []
        for _ in range(1000):
            future = log._grown(len(log))
            future.cancel()
            refs.append(weakref.ref(future))
            del future
        await asyncio.sleep(0)  # the done callbacks run
        assert log._waiting() == 0
        gc.collect()
        assert [r for r in refs if r() is not None] == []
        # A wait that is not cancelled is still woken.
        waiting = log._grown(len(log))
        log.append("x/event", {})
        await waiting
        tails = [asyncio.ensure_future(log.tail(start=len(log)).__anext__()) for _ in range(100)]
        await asyncio.sleep(0)
        assert log._waiting() == 100
        for task in tails:
            task.cancel()
        await asyncio.gather(*tails, return_exceptions=True)
        assert log._waiting() == 0

    asyncio.run(main())
    log.close()
