"""The abort signal of a turn: one per turn, shared by every seam of it (listeners, the model
call, tool bodies). The first cause wins."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Dict, List, Optional

from .errors import TurnAborted

__all__ = ["Signal"]

_log = logging.getLogger("kerman")


class Signal:
    """The abort signal of one turn, shared by every seam of that turn. First cause wins."""

    __slots__ = ("_reason", "_callbacks", "_waiters")

    def __init__(self) -> None:
        # The lists are made on first use: most turns' signals are never waited on.
        self._reason: Optional[Dict[str, Any]] = None
        self._callbacks: Optional[List[Callable[[Dict[str, Any]], object]]] = None
        self._waiters: Optional[List[asyncio.Future[None]]] = None

    @property
    def aborted(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> Optional[Dict[str, Any]]:
        """The cause dict given to the first ``cancel()``, or ``None``."""
        return None if self._reason is None else dict(self._reason)

    def add_callback(self, fn: Callable[[Dict[str, Any]], object]) -> None:
        """Calls ``fn(reason)`` when the signal aborts, or at once if it already has."""
        if self._reason is not None:
            fn(dict(self._reason))
        elif self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    async def wait(self) -> Dict[str, Any]:
        """Waits until the signal aborts; returns the reason."""
        if self._reason is None:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(fut)
            await fut
        assert self._reason is not None
        return dict(self._reason)

    def raise_if_aborted(self) -> None:
        """Raises :class:`kerman.TurnAborted` if the signal has aborted."""
        if self._reason is not None:
            raise TurnAborted(dict(self._reason))

    def _abort(self, reason: Dict[str, Any]) -> bool:
        if self._reason is not None:
            return False
        self._reason = dict(reason)
        callbacks, self._callbacks = self._callbacks or (), None
        for fn in callbacks:
            try:
                fn(dict(reason))
            except Exception:  # contained: one callback cannot stop the others
                _log.exception("signal callback %r raised", fn)
        waiters, self._waiters = self._waiters or (), None
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        return True

    def __repr__(self) -> str:
        return f"<Signal aborted={self._reason!r}>" if self._reason else "<Signal live>"
