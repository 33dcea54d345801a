"""``AgentLoop``'s driver: starting the native driver (the loop's Task) when input wakes an idle
loop, what happens when it finishes, cancellation, idling and closing."""

from __future__ import annotations

import asyncio
import logging
import warnings
from typing import TYPE_CHECKING, Any, Dict, Optional, Union, cast

from .. import _continuation
from ..signal import Signal
from .state import _cause, _current_loop, _LoopState

if TYPE_CHECKING:
    from ..loop import AgentLoop


class TurnStillRunningWarning(RuntimeWarning):
    """``await loop.when_idle()`` was cancelled (an interrupted notebook cell, a timeout) while a
    turn was still running: the turn goes on in the background. ``loop.cancel()`` stops it;
    ``await loop.when_idle()`` waits for it again."""


async def _finished(task: asyncio.Task[Any]) -> None:
    """Waits for ``task`` to finish without raising its outcome and without cancelling it when
    the waiter is cancelled. ``asyncio.wait({task})`` does the same with more machinery and
    leaves callbacks behind for the next iteration; replacing it took 30-45% off the time a
    loop run one turn at a time spends outside a 50 ms model call (docs/performance.md)."""
    done = asyncio.get_running_loop().create_future()

    def wake(_: Any) -> None:
        if not done.done():
            done.set_result(None)

    task.add_done_callback(wake)
    try:
        await done
    finally:
        task.remove_done_callback(wake)


class _Driver(_LoopState):
    # ---- the driver -------------------------------------------------------------------------

    def _wake(self, after_abort: bool) -> None:
        """Reference 5.3: start a driver when idle; latch a wake the running one cannot deliver."""
        if self._status == "waiting":
            # A reopened step's calls that need no decision run (input waits for the turn).
            self._resume_held()
            return
        if self._status != "idle":
            if after_abort:  # only input redirected by a cancel in progress can latch
                self._core.latch_wake(True)
            return
        self._start_driver()

    def _start_driver(self, abort: Optional[Dict[str, Any]] = None, prepared: bool = False) -> None:
        if self._closing:
            return
        if self._requeue_due:
            self._requeue_due = False
            _continuation.requeue_interrupted(cast("AgentLoop", self))
        if not prepared and self._resume_preparers and self._event_loop is not None and self._core.resumable:
            self._set_status("running")
            self._task = self._event_loop.create_task(self._prepare_resume(abort))
            return
        # The turn's signal exists before "running" is announced: a listener of that may cancel.
        self._core.prepare(Signal())
        if abort is not None:  # a held step cancelled while it waited: it resumes aborted
            self._core.abort(abort)
            self._core.signal._abort(abort)
        self._set_status("running")
        # begin appends turn/start and makes the first claim; None: no turn recorded.
        try:
            self._began_resumed = self._core.resumable
            self._decided_at_start = self._decided
            driver = self._core.begin(self)
        except BaseException:
            self._set_status("idle")  # nothing started: no driver will set it back
            raise
        if driver is None:
            self._finish_driver()
            return
        assert self._event_loop is not None
        # The driver (kerman._core.Driver) runs turns until one stops it, then calls
        # _driver_finished; an outside cancellation ends the turn disposed and propagates.
        self._task = self._event_loop.create_task(driver)

    async def _prepare_resume(self, abort: Optional[Dict[str, Any]]) -> None:
        for prepare in list(self._resume_preparers):
            try:
                await prepare()
            except Exception:
                # The step goes on: a call of a tool that is not registered gets its error result.
                logging.getLogger("kerman").exception("preparing to resume session %r failed", self._log.id)
        self._task = None
        self._start_driver(abort, prepared=True)

    def _finish_driver(self) -> None:
        latched = self._core.take_latch()
        if self._core.waiting:
            # The step stopped at its decisions; input queued meanwhile waits for the turn.
            self._set_status("waiting")
            self._arm_expiry()
            # A decision applied on another thread between the run's last read of the log and
            # the status change saw "running" and left the step to this method: read again. A
            # run that began by resuming the step and left it resumable with no decision since
            # (its log failed) is not started again here.
            if not self._began_resumed or self._decided != self._decided_at_start:
                self._resume_held()
            return
        if not self._began_resumed and self._core.fenced is None and self._core.resumable:
            # Every request was decided before the run that asked had even ended (the requests
            # are visible to other processes as soon as they are logged, and loop.decide, which
            # saw "running", left the step to this method): the step goes on now, still
            # "running". A run that began by resuming the step and left it resumable (its log
            # failed) is not started again here.
            self._start_driver()
            return
        self._set_status("idle")
        runs = self._runs_in_flight
        if runs is not None and runs.by_message:
            runs.idle()
        if latched and self._core.fenced is None and self._inbox.has_pending and self._status == "idle":
            self._start_driver()

    # ---- cancellation and idling ------------------------------------------------------------

    def cancel(self, cause: Union[str, Dict[str, Any]] = "user", *, keep_inbox: bool = False) -> None:
        """Aborts the running turn (first cause wins) and throws ``CancelledError`` into the
        listener, model or tool it awaits. Without ``keep_inbox`` pending input is discarded."""
        reason = _cause(cause)
        here = _current_loop()
        if self._event_loop is not None and here is not self._event_loop:
            self._call_on_loop(self._cancel, reason, keep_inbox)
            return
        self._cancel(reason, keep_inbox)

    def _cancel(self, reason: Dict[str, Any], keep_inbox: bool) -> None:
        failed: Optional[BaseException] = None
        if not keep_inbox:
            self._core.clear_latch()
            try:
                self._inbox.clear()
            except Exception as exc:
                # E.g. from a log observer, where appending is refused as reentrant: the turn
                # is still aborted; the caller learns that pending input was not discarded.
                failed = exc
        if self._status == "waiting" and reason.get("kind") != "disposed":
            # The pending requests are cancelled (logged); the step resumes aborted, so its
            # calls get their aborted results and the turn ends as a cancel ends it.
            self._core.cancel_decisions()
            self._disarm_expiry()
            if self._event_loop is not None and not self._event_loop.is_closed():
                self._start_driver(abort=reason)
            else:
                # No event loop: the step resumes at the next wake(), aborted (the core reads
                # the cancelled requests from the log).
                self._set_status("idle")
        elif self._status == "running" and self._core.abort(reason):
            self._core.signal._abort(reason)
            task = self._task
            # Throw into the listener, model or tool the driver awaits (once).
            if task is not None and not task.done() and self._core.should_throw():
                task.cancel()
        if failed is not None:
            raise failed

    async def when_idle(self) -> None:
        """Waits until no turn is running, following turns started at convergence. Never raises
        for a failed turn. Cancelling the wait (an interrupted notebook cell, a timeout) does not
        cancel the turn: it goes on, and a ``TurnStillRunningWarning`` says so and how to stop it."""
        while self._task is not None:
            task = self._task
            if not task.done():
                try:
                    await _finished(task)
                except asyncio.CancelledError:
                    if self._status == "running":
                        warnings.warn(
                            f"waiting for session {self._log.id!r} was cancelled, but its turn {self.turn} is "
                            f"still running in the background: loop.cancel() stops it, "
                            f"await loop.when_idle() waits for it again",
                            TurnStillRunningWarning,
                            stacklevel=2,
                        )
                    raise
            if self._task is task:
                break

    async def aclose(self, discard_pending: bool = False) -> None:
        """Cancels with cause ``disposed``, waits until idle, flushes, closes the log if this
        loop created it, and closes the loop's inbox, so another ``AgentLoop`` or ``Inbox`` may
        be created over the log. Pending input stays durable for the next resume unless
        ``discard_pending``."""
        self._closing = True
        self._disarm_expiry()  # a turn waiting for decisions stays waiting, in the log
        if self._status == "running" or discard_pending:
            self.cancel("disposed", keep_inbox=not discard_pending)
        await self.when_idle()
        try:
            if not self._log.closed and self._core.fenced is None:
                await self._log.flush()
                if self._owns_log:
                    await self._log.aclose()
        finally:
            # A log has at most one inbox: this loop's gives way to the next (a notebook
            # re-creating its loop over the same log).
            self._inbox.close()
            # Tool sources (MCP servers) stop once no turn can call them.
            for source in self._sources:
                await source._kerman_detach(cast("AgentLoop", self))
