"""Issue 11, item 1: what a program drops is freed.

Native classes that hold Python objects take part in the garbage collector, so the cycles a
framework or plugin makes as a matter of course (a callback that refers back to the loop, an
observer that refers to its log, a tool that refers to the loop it is registered on) are
collected. A file-backed log that becomes unreachable flushes what was appended, releases its
lock and its writer thread, and warns with ``ResourceWarning`` that it was not closed, the way
a dropped Python file does.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
import weakref
from typing import Any, Callable, List

import pytest

import kerman


async def reply(request: kerman.ModelRequest) -> kerman.ModelReply:
    return kerman.ModelReply("hi")


def collected(refs: List[weakref.ref[Any]]) -> int:
    gc.collect()
    return sum(r() is None for r in refs)


def run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


def test_a_dropped_loop_is_freed_after_a_turn():
    async def main() -> List[weakref.ref[Any]]:
        refs = []
        for _ in range(10):
            loop = kerman.AgentLoop(reply)
            loop.followup("x")
            await loop.when_idle()
            await loop.aclose()
            refs.append(weakref.ref(loop))
            refs.append(weakref.ref(loop.inbox))
            refs.append(weakref.ref(loop.log))
            del loop
        return refs

    refs = run(main)
    assert collected(refs) == len(refs)


def test_a_loop_never_run_is_freed():
    loop = kerman.AgentLoop(reply)
    ref = weakref.ref(loop)
    del loop
    assert collected([ref]) == 1


def test_cycles_through_listeners_tools_and_seams_are_collected():
    """Every registration point holds a function that refers back to the loop."""

    async def main() -> List[weakref.ref[Any]]:
        loop = kerman.AgentLoop(reply)
        holder = {"loop": loop}

        @loop.tool
        async def clock(args: Any, ctx: Any) -> str:
            "The time."
            return str(holder["loop"].turn)

        @loop.pre_step
        async def guard(step: Any, next: Any) -> Any:
            holder["seen"] = loop
            return await next()

        loop.on("agent/status", lambda e: holder.setdefault("status", loop))
        loop.on("agent/inbox/inserted", lambda e: holder.setdefault("inserted", loop))
        loop.on("agent/inbox/claimed", lambda e: holder.setdefault("claimed", loop))
        loop.log.subscribe(lambda e: holder.setdefault("event", loop))
        loop.followup("x")
        await loop.when_idle()
        await loop.aclose()
        return [weakref.ref(loop), weakref.ref(clock), weakref.ref(guard)]

    refs = run(main)
    assert collected(refs) == len(refs)


def test_a_log_whose_observer_refers_to_it_is_collected():
    log = kerman.MemoryStore().create("s")
    seen: List[Any] = []
    # `del` below drops the frame's references, leaving the cycle only: pyflakes then calls the
    # closure's names undefined (F821), which they are not while it can run.
    log.subscribe(lambda event: seen.append((log, event)))  # noqa: F821
    log.append("plugin/x", {})
    assert len(seen) == 1
    ref = weakref.ref(log)
    del log, seen
    assert collected([ref]) == 1


def test_an_inbox_whose_callbacks_refer_to_it_is_collected():
    log = kerman.MemoryStore().create("s")
    box: List[Any] = []
    # As above: the names are deleted below on purpose (F821).
    inbox = kerman.Inbox(
        log,
        on_inserted=lambda m: box.append(inbox),  # noqa: F821
        on_discarded=lambda m: box.append(inbox),  # noqa: F821
        on_claimed=lambda m, turn: box.append(inbox),  # noqa: F821
    )
    inbox.append("next-turn", "hello")
    assert box == [inbox]
    refs = [weakref.ref(inbox), weakref.ref(log)]
    del inbox, log, box
    assert collected(refs) == 2


class Box:
    """A weakly referenceable object to put inside payloads."""

    event: Any = None


def test_an_event_whose_data_refers_to_it_is_collected():
    log = kerman.MemoryStore().create("s")
    event = log.append("plugin/x", {"k": 1})
    box = Box()
    box.event = event
    event.data["box"] = box
    ref = weakref.ref(box)
    del event, box
    assert collected([ref]) == 1
    log.close()


def test_a_next_held_by_its_own_listener_is_collected():
    """``Next`` holds its listeners and payload; a listener that keeps ``next`` makes a cycle."""
    kept: List[Any] = []

    def listener(payload: Any, next: Any) -> Any:
        kept.append(next)  # noqa: F821 (deleted below on purpose, as above)
        return next()

    nxt = kerman._core.Next([listener], {"p": kept}, lambda: "done")
    ref = weakref.ref(listener)
    del listener
    nxt()
    del nxt, kept
    assert collected([ref]) == 1


def test_weak_references_to_log_inbox_and_loop():
    log = kerman.MemoryStore().create("s")
    inbox = kerman.Inbox(log)
    loop = kerman.AgentLoop(reply)
    assert weakref.ref(log)() is log
    assert weakref.ref(inbox)() is inbox
    assert weakref.ref(loop)() is loop


def test_a_dropped_file_log_flushes_releases_its_lock_and_warns(tmp_path):
    store = kerman.FileStore(str(tmp_path), durability="batch")
    log = store.create("s")
    for i in range(50):
        log.append("plugin/x", {"i": i})
    with pytest.warns(ResourceWarning, match='SessionLog "s" was not closed'):
        del log
        gc.collect()
    again = store.open("s")
    assert [e.data["i"] for e in again.events(types="plugin/x")] == list(range(50))
    again.close()


def test_a_dropped_file_backed_loop_releases_its_session_in_the_same_process(tmp_path):
    """A notebook re-runs the cell that opens the session: no kernel restart needed."""
    store = kerman.FileStore(str(tmp_path), durability="strict")

    async def cell() -> int:
        log = store.open("chat") if store.exists("chat") else store.create("chat")
        loop = kerman.AgentLoop(reply, log=log)
        loop.on("agent/status", lambda e: loop.turn)
        loop.followup("again")
        await loop.when_idle()
        return loop.turn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        assert run(cell) == 1
        gc.collect()
        assert run(cell) == 2
        gc.collect()
    with store.open("chat") as log:
        assert [e.data["turn"] for e in log.events(types="turn/end")] == [1, 2]


def test_a_closed_log_dropped_does_not_warn(tmp_path):
    store = kerman.FileStore(str(tmp_path))
    with store.create("s") as log:
        log.append("plugin/x", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del log
        gc.collect()


def test_a_memory_log_dropped_open_does_not_warn():
    """Nothing is held by a memory log: there is nothing to release, so nothing to warn of."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        log = kerman.MemoryStore().create("s")
        del log
        gc.collect()


def test_async_with_agent_loop_closes_it():
    async def main() -> kerman.AgentLoop:
        async with kerman.AgentLoop(reply) as loop:
            loop.followup("x")
            await loop.when_idle()
            assert loop.status == "idle"
        return loop

    loop = run(main)
    with pytest.raises(kerman.LoopError):
        loop.followup("after close")


def test_with_store_open_closes_the_log(tmp_path):
    store = kerman.FileStore(str(tmp_path))
    store.create("s").close()
    with store.open("s") as log:
        log.append("plugin/x", {})
    assert log.closed
    with store.open("s") as again:
        assert [e.type for e in again] == ["plugin/x"]


def test_a_dropped_loop_is_freed_by_reference_counting_alone():
    """No collection needed: the loop's own callbacks hold it weakly, so what its session holds
    (a 1 MB prompt) goes the moment the program lets go of the loop."""

    async def main() -> weakref.ref[Any]:
        loop = kerman.AgentLoop(reply)
        loop.on("agent/inbox/inserted", lambda event: None)
        loop.followup("x" * 1_000_000)
        await loop.when_idle()
        await loop.aclose()
        return weakref.ref(loop)

    gc.disable()
    try:
        ref = run(main)
        assert ref() is None
    finally:
        gc.enable()
