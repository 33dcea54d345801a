"""Dispatch modes (reference 6.2): serial and contained emit. The waterfall's cursor is
``kerman._core.Next``, driven by the Rust turn driver."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from typing import Any, Callable, List, Sequence

from ._report import callable_name

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
        except Exception as exc:
            _log.error('agent event "%s" listener %s raised %s: %s', what, _name(listener), type(exc).__name__, exc, exc_info=exc)
            continue
        if result is not None and inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            task.add_done_callback(functools.partial(_report, what=what))


def _report(task: asyncio.Future[Any], *, what: str) -> None:
    exc = None if task.cancelled() else task.exception()
    if exc is not None:
        _log.error('agent event "%s" async listener raised %s: %s', what, type(exc).__name__, exc, exc_info=exc)


def _name(fn: Any) -> str:
    return callable_name(fn) or repr(fn)


def register(listeners: List[Callable[..., Any]], fn: Callable[..., Any], prepend: bool, where: str) -> None:
    """Adds ``fn`` to ``listeners``. A listener is registered once per seam: registering it
    again is refused (it would run twice, which is never what a plugin set up twice means)."""
    if not callable(fn):
        raise TypeError(f"a listener must be callable, got {type(fn).__name__}")
    if fn in listeners:
        raise ValueError(
            f"{_name(fn)} is already registered on {where}; a listener is registered once (loop.remove_listener(fn) takes it off)"
        )
    if prepend:
        listeners.insert(0, fn)
    else:
        listeners.append(fn)
