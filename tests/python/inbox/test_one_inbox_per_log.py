"""A log has at most one inbox (issue 12, item 4): a second Inbox or AgentLoop over one log is
refused, and a dropped or closed one gives the log up (as a notebook recreating its loop
does). No test sleeps or measures time."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from kerman import AgentLoop, FileStore, Inbox, InboxError, MemoryStore, UserMessage
from kerman.models import EchoModel

# ---- item 4: a log has at most one inbox --------------------------------------------------


def test_a_second_inbox_over_one_log_is_refused():
    log = MemoryStore().create()
    first = Inbox(log)
    first.append("next-turn", UserMessage("a", id="a"))
    with pytest.raises(InboxError, match=f'session "{log.id}" already has an inbox'):
        Inbox(log)
    with pytest.raises(InboxError, match="already has an inbox"):
        AgentLoop(EchoModel(), log=log)
    # Nothing was written by the refused ones; the first still works.
    first.append("next-turn", UserMessage("b", id="b"))
    assert [m.id for m in first.next_turn] == ["a", "b"]
    first.close()
    assert first.closed
    with pytest.raises(InboxError, match="was closed"):
        first.append("next-turn", "c")
    second = Inbox(log)
    assert [m.id for m in second.next_turn] == ["a", "b"]
    log.close()


def test_a_dropped_inbox_gives_the_log_up():
    log = MemoryStore().create()
    Inbox(log).append("next-turn", UserMessage("a", id="a"))  # dropped at once
    inbox = Inbox(log)
    assert [m.id for m in inbox.next_turn] == ["a"]
    del inbox
    Inbox(log)
    log.close()


def test_two_loops_over_one_log_the_earlier_idle_one_or_the_closed_one_gives_way(tmp_path):
    """A second AgentLoop over a log takes over from an idle earlier one (issue 15: a notebook
    cell that creates its loop running again); tests/python/jupyter/ pins the details."""
    store = FileStore(tmp_path)
    log = store.create("s")

    async def main() -> None:
        earlier = AgentLoop(EchoModel(), log=log)
        first = AgentLoop(EchoModel(), log=log)
        assert earlier.closed and not first.closed
        first.followup("one")
        await first.when_idle()
        await first.aclose()
        first.cancel()  # nothing pending: a no-op, not refused by the closed inbox
        second = AgentLoop(EchoModel(), log=log)  # the closed loop's inbox gave way
        second.followup("two")
        await second.when_idle()
        await second.aclose()

    asyncio.run(main())
    log.close()
    with store.open("s") as again:  # the log replays
        Inbox(again)
        assert [e.data["turn"] for e in again.events(types="turn/start")] == [1, 2]


def test_a_notebook_recreating_its_loop_after_dropping_the_old_one():
    """A dropped AgentLoop is garbage in a cycle (its callbacks refer to it): the next Inbox
    over the log collects it rather than being refused."""
    log = MemoryStore().create()

    async def main() -> None:
        loop = AgentLoop(EchoModel(), log=log)
        loop.followup("one")
        await loop.when_idle()
        ref = weakref.ref(loop)
        del loop
        loop = AgentLoop(EchoModel(), log=log)
        assert ref() is None
        loop.followup("two")
        await loop.when_idle()
        await loop.aclose()

    gc.disable()  # the cycle is only collected on demand
    try:
        asyncio.run(main())
    finally:
        gc.enable()
    assert len(list(log.events(types="turn/end"))) == 2
    log.close()
