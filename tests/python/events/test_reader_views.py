"""The log's readers hand out views themselves: ``log.events(view=True)``, ``log.tail(view=True)``
and ``log.subscribe(callback, view=True)`` give exactly what ``kerman.events.view`` gives for each
event, with the readers' filters and bounds unchanged; without ``view`` they give ``Event``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from test_event_views import _record_session

import kerman
from kerman import events


@pytest.fixture(scope="module")
def log() -> kerman.SessionLog:
    logger = logging.getLogger("kerman")
    disabled, logger.disabled = logger.disabled, True
    try:
        _, recorded = asyncio.run(_record_session())
    finally:
        logger.disabled = disabled
    return recorded


def _same(v: Any) -> tuple[Any, ...]:
    return type(v), v.seq, v.time, v.type, v.data, v.source_event_seqs


def test_events_view_gives_the_view_of_every_event(log: kerman.SessionLog) -> None:
    handed = list(log.events(view=True))
    assert [_same(v) for v in handed] == [_same(events.view(e)) for e in log.events()]
    assert all(isinstance(v.event, kerman.Event) for v in handed)
    assert {type(v) for v in handed} >= {
        events.TurnStart,
        events.AssistantChunk,
        events.ToolCall,
        events.ToolResultEvent,
        events.TurnEnd,
        events.OtherEvent,
    }


def test_events_view_keeps_bounds_and_type_filters(log: kerman.SessionLog) -> None:
    ends = list(log.events(types="turn/end", view=True))
    assert [type(v) for v in ends] == [events.TurnEnd] * 4
    assert [v.reason.kind for v in ends] == ["completed", "error", "blocked", "aborted"]
    window = list(log.events(start=3, stop=9, types=["assistant/*", "tool/*"], view=True))
    assert [v.seq for v in window] == [e.seq for e in log.events(start=3, stop=9, types=["assistant/*", "tool/*"])]


def test_without_view_the_readers_give_events(log: kerman.SessionLog) -> None:
    assert all(type(e) is kerman.Event for e in log.events(view=False))
    assert all(type(e) is kerman.Event for e in log.events())
    with pytest.raises(TypeError):
        log.events(0, None, None, True)  # type: ignore[call-overload]


def test_the_iterator_of_views_shows_as_the_iterator_of_events(log: kerman.SessionLog) -> None:
    viewed, plain = log.events(start=2, types="turn/*", view=True), log.events(start=2, types="turn/*")
    assert repr(viewed) == repr(plain)
    assert viewed._peek(2) == plain._peek(2) and viewed._remaining() == plain._remaining()


def test_tail_view_gives_committed_then_live_views() -> None:
    async def main() -> list[Any]:
        log = kerman.MemoryStore().create()
        log.append("plugin/a", {"n": 1})
        seen: list[Any] = []

        async def read() -> None:
            async for v in log.tail(view=True):
                seen.append(v)

        reader = asyncio.create_task(read())
        loop = kerman.AgentLoop(kerman.models.EchoModel(), log=log)
        loop.followup("hi")
        await loop.when_idle()
        await loop.aclose()
        log.close()
        await reader
        return seen

    seen = asyncio.run(main())
    assert [(type(v), v.type) for v in seen][:2] == [(events.OtherEvent, "plugin/a"), (events.InboxSpliced, "agent/inbox/spliced")]
    replies = [v for v in seen if isinstance(v, events.AssistantMessageEvent)]
    assert [r.message.text for r in replies] == ["hi"]
    assert isinstance(seen[-1], events.TurnEnd) and seen[-1].reason.kind == "completed"


def test_tail_view_filters_types_and_ends_on_close() -> None:
    async def main() -> list[Any]:
        log = kerman.MemoryStore().create()
        for n in range(3):
            log.append("plugin/a" if n % 2 == 0 else "plugin/b", {"n": n})
        log.close()
        return [v async for v in log.tail(start=1, types="plugin/a", view=True)]

    assert [(type(v), v.seq, v.data) for v in asyncio.run(main())] == [(events.OtherEvent, 2, {"n": 2})]


def test_subscribe_view_calls_back_with_views() -> None:
    log = kerman.MemoryStore().create()
    viewed: list[Any] = []
    plain: list[Any] = []
    stop_viewed = log.subscribe(viewed.append, view=True)
    stop_plain = log.subscribe(plain.append)
    inbox = kerman.Inbox(log)
    inbox.append("next-turn", "hello")
    log.append("plugin/a", {"n": 1})
    assert stop_viewed() and stop_plain()
    log.append("plugin/a", {"n": 2})
    assert [_same(v) for v in viewed] == [_same(events.view(e)) for e in plain]
    assert [type(v) for v in viewed] == [events.InboxSpliced, events.OtherEvent]
    assert viewed[0].inserted[0].text == "hello"
