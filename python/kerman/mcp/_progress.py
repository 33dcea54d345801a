"""Which progress notifications of a running MCP call reach the session log (``tool/progress``).

A server may report progress hundreds of times a second; every update reaches ``on_progress``
and the result's meta, but the log keeps a readable trace: the first update, then at most one
per :data:`INTERVAL` seconds, and always an update whose message differs from the last logged
one or whose progress reaches its total (docs/mcp.md, "Progress"). The clock is injected so the
rule is tested without waiting.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

__all__ = ["Coalescer", "INTERVAL", "record"]

logger = logging.getLogger("kerman.mcp")

#: The least time between two logged updates of one call whose message stays the same.
INTERVAL = 0.25


class Coalescer:
    """The logging rule for the updates of one call; ``clock`` gives seconds (monotonic)."""

    __slots__ = ("clock", "_last_time", "_last_message", "_logged")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last_time = 0.0
        self._last_message: Optional[str] = None
        self._logged = False

    def admit(self, progress: float, total: Optional[float], message: Optional[str]) -> bool:
        """Whether this update is logged (and, if so, it becomes the last logged one)."""
        now = self.clock()
        due = (
            not self._logged
            or message != self._last_message
            or (total is not None and progress >= total)
            or now - self._last_time >= INTERVAL
        )
        if due:
            self._logged = True
            self._last_time = now
            self._last_message = message
        return due

    def __repr__(self) -> str:
        return f"Coalescer(logged={self._logged}, last_message={self._last_message!r})"


def record(ctx: Any, progress: float, total: Optional[float], message: Optional[str]) -> None:
    """Logs ``tool/progress`` for the call of ``ctx`` (a ``ToolContext``) in its loop's log. A
    failed append is reported and does not fail the call: progress is a view of it, not part
    of its result."""
    core = getattr(getattr(ctx, "loop", None), "_core", None)
    if core is None:  # a tool run outside a loop (called directly): nothing to log into
        return
    try:
        core.record_progress(ctx.turn, ctx.step, ctx.call_id, float(progress), None if total is None else float(total), message)
    except Exception:
        logger.exception("MCP call %s: logging its progress failed", ctx.call_id)
