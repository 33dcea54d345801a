"""Small asyncio helpers used by the native module (kept in Python: they are glue, not hot)."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Optional


def resolve(fut: asyncio.Future[Any], exc: Optional[BaseException]) -> None:
    """Completes ``fut`` unless it was cancelled or completed already."""
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


async def tail(log: Any, start: int, types: Any) -> AsyncIterator[Any]:
    """Committed events from ``start``, then live ones as they commit; ends when the log closes."""
    seq = start
    while True:
        batch, seq, closed = log._batch(seq, types)
        for event in batch:
            yield event
        if closed:
            return
        await log._grown(seq)
