"""Streams a UI can consume: pure projections of a session log.

``agui(events)`` gives AG-UI events, ``vercel(events)`` the Vercel AI SDK's UI message stream
parts. Both take the log's events from seq 0, as an iterable (``log.events()``) or an async
iterable (``log.tail()``), and give ``UiEvent`` values (``.data`` is the protocol event, ``.seq``
the log event it came from, ``.id`` the SSE id). They are folds: replaying the same events
always gives the same output, and ``after=`` (an SSE ``Last-Event-ID`` such as ``"12"`` or
``"12:1"``, or a seq) folds everything up to that point without emitting it, so a client
resuming in the middle of a message gets the rest of it and no second start.

Events of types Kerman does not write (a plugin's ``log.append("progress/update", ...)``) are
shown too: AG-UI ``CUSTOM`` events and Vercel ``data-*`` parts, by default named by their type;
``custom=`` maps them (``Custom``) or drops them (``None``).

No dependency: the output is plain JSON-ready dicts (docs/web.md, "The projections").
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Iterator, Optional, Union

from ._base import ResumePoint, UiEvent, parse_resume, project
from ._custom import Custom, CustomMapping, default_custom
from .agui import AgUiProjection
from .vercel import VercelProjection

__all__ = [
    "agui",
    "vercel",
    "UiEvent",
    "ResumePoint",
    "parse_resume",
    "AgUiProjection",
    "VercelProjection",
    "Custom",
    "CustomMapping",
    "default_custom",
]


def agui(
    events: Any, *, thread_id: str = "session", after: Any = None, custom: Optional[CustomMapping] = None
) -> Union[Iterator[UiEvent], AsyncIterator[UiEvent]]:
    """The AG-UI events of ``events`` (from seq 0): an iterator, or an async iterator when
    ``events`` is async (``log.tail()``). ``thread_id`` goes into ``RUN_STARTED`` and
    ``RUN_FINISHED`` (use the session id); ``after`` resumes after that event id or seq;
    ``custom`` maps the events of types Kerman does not write (``CUSTOM`` events)."""
    return project(lambda: AgUiProjection(thread_id, custom=custom), events, after)  # type: ignore[no-any-return]


def vercel(events: Any, *, after: Any = None, custom: Optional[CustomMapping] = None) -> Union[Iterator[UiEvent], AsyncIterator[UiEvent]]:
    """The Vercel AI SDK UI message stream parts of ``events`` (from seq 0): an iterator, or an
    async iterator when ``events`` is async. ``after`` resumes after that event id or seq;
    ``custom`` maps the events of types Kerman does not write (``data-*`` parts)."""
    return project(lambda: VercelProjection(custom=custom), events, after)  # type: ignore[no-any-return]
