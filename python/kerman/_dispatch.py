"""Dispatch modes (reference 6.2): serial and contained emit. The waterfall's cursor is
``kerman._core.Next``, driven by the Rust turn driver."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from typing import Any, Callable, List, Sequence


_log = logging.getLogger("kerman")


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
