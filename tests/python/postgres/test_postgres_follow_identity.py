"""Issue 12, item 14: a follower of a PostgreSQL session that is deleted, or deleted and created
again under the same id, ends (its tail stops and the log is closed) instead of splicing the
new session's events onto the old ones (it used to show old seqs 0-9, then the new 10-14,
under the old header)."""

from __future__ import annotations

import asyncio
from typing import Any, List

from conftest import fresh_schema_dsn, needs_postgres
from kerman import PostgresStore

pytestmark = needs_postgres


async def tail_from(log: Any, start: int) -> List[Any]:
    """What the follower's tail shows past ``start`` before it ends (bounded)."""

    async def collect() -> List[Any]:
        return [event async for event in log.tail(start=start)]

    return await asyncio.wait_for(collect(), timeout=30)


def session_of(store: PostgresStore, id: str, n: int, tag: str) -> None:
    with store.create(id) as log:
        for i in range(n):
            log.append("plugin/e", {"session": tag, "i": i})


def test_a_follower_of_a_deleted_and_recreated_session_ends_without_mixing_them():
    store = PostgresStore(fresh_schema_dsn())
    session_of(store, "s", 10, "old")
    follower = store.follow("s")
    header = follower.header
    assert len(follower) == 10

    async def scenario() -> List[Any]:
        tail = asyncio.ensure_future(tail_from(follower, 10))
        store.delete("s")
        session_of(store, "s", 15, "new")
        return await tail

    assert asyncio.run(scenario()) == []
    assert follower.closed
    assert follower.header == header
    assert [e.data["session"] for e in follower] == ["old"] * 10
    # A new follower follows the new session.
    with store.follow("s") as fresh:
        assert [e.data["session"] for e in fresh] == ["new"] * 15


def test_a_follower_of_a_deleted_session_ends():
    store = PostgresStore(fresh_schema_dsn())
    session_of(store, "gone", 3, "old")
    follower = store.follow("gone")

    async def scenario() -> List[Any]:
        tail = asyncio.ensure_future(tail_from(follower, 3))
        store.delete("gone")  # notifies the session's followers, as a commit does
        return await tail

    assert asyncio.run(scenario()) == []
    assert follower.closed
