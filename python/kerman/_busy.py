"""Double-texting: what a followup does while a turn runs (``AgentLoop(on_busy=...)``,
``loop.followup(..., on_busy=...)``, ``POST /messages {on_busy}``; docs/context.md).

* ``"enqueue"``: queued for its own turn after the running one (the default);
* ``"reject"``: refused with :class:`~kerman.BusyError`, nothing queued;
* ``"interrupt"``: the running turn is cancelled (cause ``{"kind": "interrupt"}``), keeping what
  it logged (a reply cut off mid-stream is its ``interrupted`` message), then the input runs;
* ``"rollback"``: the running turn is cancelled with cause ``{"kind": "rollback"}``; its
  ``turn/end`` is the marker the history honours (the core's ``agent_loop/rollback.rs``): the
  next request sees the session as it was before that turn, whose events stay in the log.

A loop is busy while a turn runs or waits for decisions; an idle loop takes every followup as
``"enqueue"`` does. Cancelling and queueing happen together on the loop's event loop, so the
input is never claimed by the turn it cancels.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Literal, Optional, Union

from ._core import NEXT_TURN, UserMessage
from .errors import BusyError

if TYPE_CHECKING:
    from .loop import AgentLoop

OnBusy = Literal["enqueue", "reject", "interrupt", "rollback"]
POLICIES = ("enqueue", "reject", "interrupt", "rollback")


def checked(policy: object) -> OnBusy:
    """``policy`` when it is one of :data:`POLICIES`; otherwise a ``ValueError`` naming it."""
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f'on_busy must be "enqueue", "reject", "interrupt" or "rollback", got {policy!r}')
    return policy  # type: ignore[return-value]


def busy(loop: AgentLoop) -> bool:
    """Whether a turn is open: running, or waiting for decisions."""
    return loop.status in ("running", "waiting")


def followup(loop: AgentLoop, message: Union[str, UserMessage], policy: Optional[str]) -> UserMessage:
    """``loop.followup(message, on_busy=policy)``; ``None``: the loop's own policy."""
    chosen = loop.on_busy if policy is None else checked(policy)
    if chosen == "enqueue":
        return loop.send(message, NEXT_TURN, True)
    bound = loop._event_loop
    if bound is not None and bound.is_running() and not loop._on_loop_thread():
        # From another thread: applied on the loop's thread, in order with its turns.
        async def apply() -> UserMessage:
            return _apply(loop, message, chosen)

        return asyncio.run_coroutine_threadsafe(apply(), bound).result()
    return _apply(loop, message, chosen)


def _apply(loop: AgentLoop, message: Union[str, UserMessage], policy: OnBusy) -> UserMessage:
    if not busy(loop):
        return loop.send(message, NEXT_TURN, True)
    if policy == "reject":
        raise BusyError(
            f'session {loop.log.id!r} is running turn {loop.turn} ({loop.status}); on_busy="reject" refused the '
            f'followup and queued nothing (send it with on_busy="enqueue" to queue it, "interrupt" or "rollback" to stop the turn)',
            session_id=loop.log.id,
            turn=loop.turn,
        )
    # The cancel first: waking input sent while the turn is being cancelled starts the next
    # turn once this one has ended (AgentLoop.send), and the pending input stays.
    loop.cancel({"kind": policy}, keep_inbox=True)
    return loop.send(message, NEXT_TURN, True)
