"""Flush completions from many writer threads reach their futures through the loop's drain.

A writer thread wakes the loop by writing a byte to the drain's pipe, which the loop watches
with ``add_reader`` (no GIL on the writer thread); a loop without ``add_reader`` falls back to
``call_soon_threadsafe``. Tail waiters woken by a commit on another thread take the same path.
"""

import asyncio
import gc
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, List

import pytest

import kerman


async def _many_sessions(root: Path, sessions: int = 16, rounds: int = 20) -> int:
    store = kerman.FileStore(root, durability="strict")
    logs = [store.create() for _ in range(sessions)]

    async def worker(log: kerman.SessionLog) -> int:
        for i in range(rounds):
            log.append("x/event", {"i": i})
            await log.flush()
        return len(log)

    try:
        counts = await asyncio.wait_for(asyncio.gather(*(worker(log) for log in logs)), 60)
    finally:
        for log in logs:
            log.close()
    return sum(counts)


def test_concurrent_flushes_on_asyncio(tmp_path: Path) -> None:
    assert asyncio.run(_many_sessions(tmp_path)) == 16 * 20


def test_concurrent_flushes_on_uvloop(tmp_path: Path) -> None:
    uvloop = pytest.importorskip("uvloop")
    assert uvloop.run(_many_sessions(tmp_path)) == 16 * 20


def test_flushes_on_successive_loops(tmp_path: Path) -> None:
    for i in range(3):
        assert asyncio.run(_many_sessions(tmp_path / str(i), sessions=4, rounds=5)) == 20


class CountingLoop(asyncio.SelectorEventLoop):
    """A plain selector loop that counts how it was asked to wake up."""

    def __init__(self) -> None:
        super().__init__()
        self.readers: List[int] = []
        self.threadsafe = 0

    def add_reader(self, fd: Any, callback: Callable[..., Any], *args: Any) -> None:
        self.readers.append(fd)
        super().add_reader(fd, callback, *args)

    def call_soon_threadsafe(self, callback: Any, *args: Any, **kwargs: Any) -> Any:
        # Only kerman's drains (asyncio itself uses this for async generators' finalizers).
        self.threadsafe += type(callback).__name__ == "Drain"
        return super().call_soon_threadsafe(callback, *args, **kwargs)


class NoReaderLoop(CountingLoop):
    """A loop without ``add_reader``, as Windows' proactor loop is."""

    def add_reader(self, fd: Any, callback: Callable[..., Any], *args: Any) -> None:
        raise NotImplementedError


def _run_on(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


@pytest.mark.skipif(sys.platform == "win32", reason="no self-pipe there")
def test_writer_threads_wake_the_loop_through_one_watched_pipe(tmp_path: Path) -> None:
    loop = CountingLoop()
    assert _run_on(loop, _many_sessions(tmp_path, sessions=8, rounds=10)) == 80
    # One drain for the loop, watched once; the 80 completions never went through
    # call_soon_threadsafe (the path that needs the GIL on the writer thread).
    assert len(loop.readers) == 1
    assert loop.threadsafe == 0


def test_a_loop_without_add_reader_gets_its_flushes_through_call_soon_threadsafe(tmp_path: Path) -> None:
    loop = NoReaderLoop()
    assert _run_on(loop, _many_sessions(tmp_path, sessions=8, rounds=10)) == 80
    assert loop.readers == []
    assert loop.threadsafe >= 1


async def _tail_woken_by(log: kerman.SessionLog, append: Callable[[], None]) -> List[int]:
    seen: List[int] = []

    async def follow() -> None:
        async for event in log.tail():
            seen.append(event.seq)
            if len(seen) == 3:
                return

    task = asyncio.ensure_future(follow())
    await asyncio.sleep(0)  # the follower is now waiting at seq 0, before any append
    thread = threading.Thread(target=append)
    thread.start()
    await asyncio.wait_for(task, 30)
    thread.join()
    return seen


@pytest.mark.parametrize("loop_cls", [CountingLoop, NoReaderLoop], ids=["pipe", "threadsafe"])
def test_a_tail_is_woken_by_commits_on_another_thread(loop_cls: Any) -> None:
    log = kerman.MemoryStore().create()

    def append() -> None:
        for i in range(3):
            log.append("x/event", {"i": i})

    loop = loop_cls()
    assert _run_on(loop, _tail_woken_by(log, append)) == [0, 1, 2]
    if loop_cls is NoReaderLoop:
        assert loop.threadsafe >= 1  # the wake-up did come from the other thread
    elif sys.platform != "win32":
        assert (len(loop.readers), loop.threadsafe) == (1, 0)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_closed_loops_leave_no_descriptors_behind(tmp_path: Path) -> None:
    # Each loop gets a drain with a pipe; the pipe goes with the loop, including a loop that
    # closed with a completion still undelivered (a tail waiter woken after the loop ended).
    asyncio.run(_many_sessions(tmp_path / "warm", sessions=2, rounds=2))
    gc.collect()
    before = _open_fds()
    for i in range(20):
        asyncio.run(_many_sessions(tmp_path / str(i), sessions=2, rounds=2))
    logs = []
    for _ in range(5):
        log = kerman.MemoryStore().create()

        async def abandon(log: kerman.SessionLog = log) -> None:
            waiter = log._grown(0)  # registered now, completed only by the append below
            assert not waiter.done()

        asyncio.run(abandon())
        log.append("x/event", {})  # delivers to a loop that is closed
        logs.append(log)
    gc.collect()
    assert _open_fds() == before
