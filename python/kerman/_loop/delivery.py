"""``AgentLoop``'s input: ``followup``, ``steer``, ``inject``, ``send`` and ``wake``."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Optional, Union, cast

from .. import _busy, _continuation
from .._core import NEXT_STEP, NEXT_TURN, UserMessage
from ..errors import InboxError, LoopError
from .state import Target, _current_loop, _LoopState

if TYPE_CHECKING:
    from ..loop import AgentLoop

# The source of a str passed to inject(): context, not a human prompt ({"kind": "user"}).
_CONTEXT_SOURCE = {"kind": "context"}


class _Delivery(_LoopState):
    # ---- delivery ---------------------------------------------------------------------------

    def followup(self, message: Union[str, UserMessage], *, on_busy: Optional[_busy.OnBusy] = None) -> UserMessage:
        """Queues a prompt for its own turn and wakes the loop. While a turn runs (or waits for
        decisions), ``on_busy`` (default: the loop's :attr:`on_busy`) says what happens:
        ``"enqueue"`` queues it after the turn, ``"reject"`` raises :class:`~kerman.BusyError`
        and queues nothing, ``"interrupt"`` cancels the turn (keeping what it logged) and runs
        the prompt next, ``"rollback"`` cancels the turn and the session goes on from before it
        (docs/context.md, "Double-texting")."""
        if on_busy is None and self._on_busy == "enqueue":
            return self.send(message, NEXT_TURN, True)
        return _busy.followup(cast("AgentLoop", self), message, on_busy)

    @property
    def on_busy(self) -> _busy.OnBusy:
        """What a followup does while a turn runs, unless it says otherwise: ``"enqueue"``,
        ``"reject"``, ``"interrupt"`` or ``"rollback"`` (``AgentLoop(on_busy=)``)."""
        return self._on_busy

    @on_busy.setter
    def on_busy(self, value: _busy.OnBusy) -> None:
        self._on_busy = _busy.checked(value)

    def steer(self, message: Union[str, UserMessage]) -> UserMessage:
        """Queues input for the nearest step boundary of the running turn, and wakes the loop."""
        return self.send(message, NEXT_STEP, True)

    def inject(self, message: Union[str, UserMessage]) -> UserMessage:
        """Queues context for the next step boundary without waking the loop. A ``str`` becomes a
        message with source ``{"kind": "context"}`` (not a human's: UIs show it as context, not
        steering); a ``UserMessage`` keeps its own source."""
        if isinstance(message, str):
            message = UserMessage(message, source=_CONTEXT_SOURCE)
        return self.send(message, NEXT_STEP, False)

    def send(self, message: Union[str, UserMessage], target: Target, wakeup: bool = True) -> UserMessage:
        """Inserts ``message`` at the end of ``target``; wakes the loop when ``wakeup``.

        Waking input sent while the running turn is being cancelled becomes a new turn
        (next-turn) and is replayed once the cancelled turn has ended.
        """
        if target not in (NEXT_TURN, NEXT_STEP):
            raise ValueError(f'target must be "next-turn" or "next-step", got {target!r}')
        # Every prompt passes here: the checks of _check_fenced and _wake are written out
        # rather than called (a Python call costs about as much as the native insertion).
        core = self._core
        if core.fenced is not None:
            self._check_fenced()
        # On the bound loop's own thread while it runs: no get_running_loop() (a getpid
        # syscall per call). Anywhere else, ask asyncio.
        bound = self._event_loop
        if bound is not None and self._loop_thread == threading.get_ident() and bound.is_running():
            here: Optional[asyncio.AbstractEventLoop] = bound
        else:
            here = _current_loop()
        on_thread = here is not None and here is bound
        if wakeup and not on_thread:
            if here is not None and self._event_loop is None:
                self._bind(here)
                on_thread = True
            elif here is not None and self._on_loop_thread():
                raise LoopError("this AgentLoop is bound to another event loop")
            elif self._event_loop is None:
                raise LoopError("AgentLoop cannot wake: no event loop is running (call from async code)")
            elif self._event_loop.is_closed():
                # Refused before inserting: a caller told of a failure must not find it queued.
                raise LoopError("the AgentLoop's event loop is closed; nothing was queued")
        after_abort = wakeup and self._status == "running" and core.aborted
        try:
            stored = self._inbox.append(NEXT_TURN if after_abort else target, message)
        except InboxError as e:
            if self._successor is not None:
                raise LoopError(
                    f"this AgentLoop over session {self._log.id!r} was replaced by a newer one "
                    f"({self._successor()!r}); send input to that one"
                ) from e
            raise
        if wakeup:
            if not on_thread:
                self._call_on_loop(self._wake, after_abort)
            elif self._status == "idle":  # read again: the insertion's listeners ran
                self._start_driver()
            elif after_abort:
                core.latch_wake(True)  # what _wake does for a loop that is not idle
        return stored

    def wake(self) -> bool:
        """Starts a turn if the loop is idle and input is pending (e.g. after a resume)."""
        self._check_fenced()
        if self._requeue_due and self._status == "idle":
            self._requeue_due = False
            _continuation.requeue_interrupted(cast("AgentLoop", self))
        if not self._inbox.has_pending and not (self._status in ("idle", "waiting") and self._core.resumable):
            return False
        here = _current_loop()
        if here is None or (self._event_loop is not None and not self._on_loop_thread()):
            # Not in async code, or on another thread (with an event loop of its own or not):
            # the wake is scheduled on the bound loop (SPEC 4.3).
            if self._event_loop is None:
                raise LoopError("AgentLoop cannot wake: no event loop is running (call from async code)")
            self._call_on_loop(self._wake, False)
            return True
        if self._event_loop is None:
            self._bind(here)
        elif here is not self._event_loop:
            raise LoopError("this AgentLoop is bound to another event loop")
        was_idle = self._status in ("idle", "waiting")
        self._wake(False)
        # False when no turn started after all: the log refused turn/start (reported as
        # agent/error), e.g. after a failed write poisoned it.
        return was_idle and self._status == "running"
