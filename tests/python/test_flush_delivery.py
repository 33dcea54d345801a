"""Flush completions from many writer threads reach their futures through the loop's drain."""

import asyncio
from pathlib import Path

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
