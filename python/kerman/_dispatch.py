"""Dispatch modes (reference 6.2): waterfall, serial and contained emit."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from typing import Any, Awaitable, Callable, List, Sequence

from ._core import Next

_log = logging.getLogger("kerman")


def waterfall(listeners: Sequence[Callable[..., Any]], payload: Any, default: Callable[[], Any]) -> Awaitable[Any]:
    """Runs ``listeners`` as a waterfall over one shared ``payload``.

    Each listener is called as ``listener(payload, next)``. ``next()`` pulls the next remaining
    listener from this dispatch's cursor (kept in Rust, ``kerman._core.Next``) — or, once none
    remain, calls ``default()`` — and returns an awaitable of its result. Not calling ``next()``
    short-circuits; calling it twice pulls the next remaining listener (then the default). The
    outermost result is the result; sync listeners' plain return values are wrapped.
    """
    result: Awaitable[Any] = Next(list(listeners), payload, default)()
    return result


async def serial(listeners: Sequence[Callable[..., Any]], payload: Any) -> None:
    """Awaits listeners one by one; stops early when one returns a truthy "bail" value."""
    for listener in list(listeners):
        result = listener(payload)
        if inspect.isawaitable(result):
            result = await result
        if result is not None and result is not False:
            return


def emit(listeners: Sequence[Callable[..., Any]], event: Any, what: str) -> None:
    """Calls every listener synchronously; failures (and async listeners' failures) are logged."""
    for listener in list(listeners):
        try:
            result = listener(event)
        except Exception:
            _log.exception('agent event "%s" listener threw', what)
            continue
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            task.add_done_callback(functools.partial(_report, what=what))


def _report(task: "asyncio.Future[Any]", *, what: str) -> None:
    if not task.cancelled() and task.exception() is not None:
        _log.error('agent event "%s" listener rejected', what, exc_info=task.exception())


def register(listeners: List[Callable[..., Any]], fn: Callable[..., Any], prepend: bool) -> None:
    if not callable(fn):
        raise TypeError(f"a listener must be callable, got {type(fn).__name__}")
    if prepend:
        listeners.insert(0, fn)
    else:
        listeners.append(fn)
