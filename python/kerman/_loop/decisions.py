"""``AgentLoop``'s decisions surface: pending requests, ``decide``, calls in doubt and
``resolve``, taking up a waiting step, and the timer that expires requests."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from ..decisions import PendingDecision
from ..errors import DecisionError, LoopError
from ..tools import ToolResult
from .state import _current_loop, _LoopState


class _Decisions(_LoopState):
    @property
    def decisions(self) -> List[PendingDecision]:
        """The requests waiting for a person's decision, oldest first (a fold of the log: a
        loop that reopened the session lists what an earlier process left pending)."""
        return [PendingDecision(**d) for d in self._core.decisions()]

    def decide(self, decision_id: str, outcome: Any, *, by: Optional[str] = None, key: Optional[str] = None) -> bool:
        """Applies a person's decision (``Approve()``, ``Deny(reason)``, ``Edit(arguments)``,
        ``Answer(value)``) to pending request ``decision_id``: one ``decision/resolved`` is
        appended, and once every request of the step is decided the step goes on (the call
        runs, or gets its denial or answer as its result) without asking the model again.
        The same ``key`` again is applied once (returns False); an unknown, resolved or expired
        request raises :class:`kerman.DecisionError` naming why."""
        self._check_fenced()
        try:
            duplicate, ready = self._core.decide(decision_id, outcome, by, key)
            self._decided += 1
        except DecisionError:
            # An expired request was resolved as such: its step may go on all the same.
            self._resume_held()
            raise
        if ready:
            self._resume_held()
        return not duplicate

    @property
    def in_doubt(self) -> List[Dict[str, Any]]:
        """The calls in doubt of the last turn (their ``tool/call`` is logged, their result is
        not): ``{"call_id", "name", "seq", "policy"}`` each (``docs/durability.md``)."""
        return [dict(call_id=c, name=n, seq=s, policy=p) for c, n, s, p in self._core.in_doubt()]

    def resolve(self, call_id: str, result: Any) -> int:
        """Records ``result`` (a ``str``, or a ``ToolResult`` whose content is a ``str``; an
        error result when its ``is_error``) as the one result of call ``call_id`` in doubt;
        runs nothing. Once no call of the step is left for a resume to settle, the turn is
        closed as interrupted. Returns the result's seq; ``ValueError`` for a call not in
        doubt (it has its result, never started, or is not a call of the last turn)."""
        self._check_fenced()
        if isinstance(result, ToolResult):
            if not isinstance(result.content, str):
                raise TypeError("resolve() takes a ToolResult whose content is a str")
            text, is_error = result.content, result.is_error
        elif isinstance(result, str):
            text, is_error = result, False
        else:
            raise TypeError(f"resolve() takes a str or a ToolResult, got {type(result).__name__}")
        with self._settling:
            if self._status == "running":
                raise ValueError(
                    f"call {call_id!r} is not in doubt now: session {self._log.id!r} is running a step, "
                    f"which settles its calls by their policies"
                )
            seq = self._core.resolve(call_id, text, is_error)
        if self._status == "waiting" and not self._core.waiting:
            # The result answered the request the turn waited for, and closed the turn: the
            # loop is idle, and a loop that continues crashed turns continues this one.
            self._set_status("idle")
            if self._core.resumable and self._event_loop is not None and not self._closing:
                if self._on_loop_thread():
                    self._wake(False)
                else:
                    try:
                        self._call_on_loop(self._wake, False)
                    except LoopError:
                        pass  # its event loop is gone: the next owner's run continues the turn
        return int(seq)

    def _resume_held(self) -> None:
        """Takes up a waiting step that has something to do (on the bound event loop): its
        decisions are all in, or a call that needs none has no result yet."""
        if self._status != "waiting" or not self._core.resumable:
            return
        here = _current_loop()
        if self._event_loop is None:
            if here is None:
                self._set_status("idle")  # no event loop: the step resumes at the next wake()
                return
            self._bind(here)
        elif here is not self._event_loop:
            self._call_on_loop(self._resume_held)
            return
        self._disarm_expiry()
        self._start_driver()

    def _arm_expiry(self) -> None:
        """While waiting: a timer resolves requests as their deadlines pass."""
        self._disarm_expiry()
        deadline = self._core.next_expiry
        if deadline is None or self._event_loop is None or self._event_loop.is_closed():
            return
        delay = max(0.0, deadline / 1000 - time.time())
        self._expiry = self._event_loop.call_later(delay, self._expire_due)

    def _disarm_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _expire_due(self) -> None:
        self._expiry = None
        if self._status != "waiting" or self._log.closed or self._inbox.closed:
            return
        self._core.expire()
        if self._core.waiting:
            self._arm_expiry()
        else:
            self._resume_held()
