"""Streams a UI can consume: pure projections of a session log.

``agui(events)`` gives AG-UI events, ``vercel(events)`` the Vercel AI SDK's UI message stream
parts. Both take the log's events from seq 0, as an iterable (``log.events()``) or an async
iterable (``log.tail()``), and give ``UiEvent`` values (``.data`` is the protocol event, ``.seq``
the log event it came from, ``.id`` the SSE id). They are folds: replaying the same events
always gives the same output, and ``after=`` (an SSE ``Last-Event-ID`` such as ``"12"`` or
``"12:1"``, or a seq) folds everything up to that point without emitting it, so a client
resuming in the middle of a message gets the rest of it and no second start.

No dependency: the output is plain JSON-ready dicts (docs/web.md, "The projections").
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Iterator, Union

from ._base import ResumePoint, UiEvent, parse_resume, project
from .agui import AgUiProjection
from .vercel import VercelProjection

__all__ = ["agui", "vercel", "UiEvent", "ResumePoint", "parse_resume", "AgUiProjection", "VercelProjection"]


def agui(events: Any, *, thread_id: str = "session", after: Any = None) -> Union[Iterator[UiEvent], AsyncIterator[UiEvent]]:
    """The AG-UI events of ``events`` (from seq 0): an iterator, or an async iterator when
    ``events`` is async (``log.tail()``). ``thread_id`` goes into ``RUN_STARTED`` and
    ``RUN_FINISHED`` (use the session id); ``after`` resumes after that event id or seq."""
    return project(lambda: AgUiProjection(thread_id), events, after)  # type: ignore[no-any-return]


def vercel(events: Any, *, after: Any = None) -> Union[Iterator[UiEvent], AsyncIterator[UiEvent]]:
    """The Vercel AI SDK UI message stream parts of ``events`` (from seq 0): an iterator, or an
    async iterator when ``events`` is async. ``after`` resumes after that event id or seq."""
    return project(VercelProjection, events, after)  # type: ignore[no-any-return]
