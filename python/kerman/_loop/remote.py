"""What another process asks of ``AgentLoop`` through the store (``PostgresStore.enqueue``,
``cancel``, ``requeue``, ``decide``, ``resolve``), applied on the store's thread in order with
the staged input around it."""

from __future__ import annotations

from typing import Any, Dict

from ..decisions import outcome_of
from ..errors import DecisionError, LeaseLostError, LoopError
from ..tools import ToolResult
from .state import _cause, _LoopState

# How long a decision from another process waits for the AgentLoop it reached to be built.
_CONSTRUCTION_WAIT = 5.0


class _Remote(_LoopState):
    def _remote_input(self, wake: bool) -> None:
        """Input another process enqueued was inserted (on the store's thread): wake as
        ``followup`` would. (getattr: this may run before ``__init__`` has finished.)"""
        if wake and getattr(self, "_event_loop", None) is not None:
            self._call_on_loop(self._wake_remote)

    def _wake_remote(self) -> None:
        # As followup: input arriving while the turn is being cancelled starts the next turn.
        self._wake(self._status == "running" and self._core.aborted)

    def _remote_cancel(self, cause: Any, keep_inbox: bool) -> Dict[str, Any]:
        """Another process asked to cancel (``PostgresStore.cancel``), on the store's thread, in
        order with the staged input around it: pending input is discarded here and now (input
        staged after the cancel is inserted after this), the running turn is aborted on the
        loop's event loop; a turn that started after this point is not touched."""
        try:
            reason = _cause(cause)
        except (TypeError, ValueError) as e:
            return {"applied": False, "op": "cancel", "reason": "invalid", "detail": str(e)}
        if self._core.fenced is not None:
            return {"applied": False, "op": "cancel", "reason": "fenced", "detail": "this owner was fenced out of the session"}
        discarded = [] if keep_inbox else [m.id for m in self._inbox.clear()]
        running = self._status == "running" and self._event_loop is not None
        turn = self.turn
        if running:
            self._call_on_loop(self._abort_remote, reason, turn)
        return {
            "applied": True,
            "op": "cancel",
            "cancelled": running,
            "turn": turn if running else None,
            "keep_inbox": keep_inbox,
            "discarded": discarded,
        }

    def _remote_requeue(self, turn: int) -> Dict[str, Any]:
        """Another process asked to send again what turn ``turn`` claimed and never read
        (``PostgresStore.requeue``), on the store's thread, in order with the staged input
        around it: requeued here and now, then the loop wakes (on its event loop) to run it.
        (getattr: staged input may be applied before ``__init__`` has finished.)"""
        core = getattr(self, "_core", None)
        if core is None:
            return {"applied": False, "op": "requeue", "reason": "no-loop", "detail": "the session's AgentLoop is not set up yet"}
        if core.fenced is not None:
            return {"applied": False, "op": "requeue", "reason": "fenced", "detail": "this owner was fenced out of the session"}
        try:
            requeued = self.requeue_claimed(turn)
        except LoopError as e:
            return {"applied": False, "op": "requeue", "reason": "nothing-to-requeue", "detail": str(e)}
        if getattr(self, "_event_loop", None) is not None:
            try:
                self._call_on_loop(self._wake_remote)
            except LoopError:
                pass  # its event loop is gone: the input stays pending, durable, for the next owner
        return {"applied": True, "op": "requeue", "turn": turn, "requeued": [m.id for m in requeued]}

    def _remote_decide(self, args: Dict[str, Any]) -> Dict[str, Any]:
        """Another process decided a pending request (``PostgresStore.decide``), on the store's
        thread, in order with the staged input around it: applied by :meth:`decide` here and
        now (the step resumes on the loop's event loop once every request of it is decided).
        A worker taking the session for this decision builds its loop while the staged rows are
        read: the decision waits (a few seconds at most) for the constructor to finish."""
        decision_id = args.get("decision_id")

        def refused(reason: str, detail: str) -> Dict[str, Any]:
            return {"applied": False, "op": "decide", "decision_id": decision_id, "reason": reason, "detail": detail}

        if not self._constructed.wait(_CONSTRUCTION_WAIT):
            return refused("no-loop", "the session's AgentLoop is not set up yet")
        try:
            outcome = outcome_of(args.get("outcome"))
            applied = self.decide(str(decision_id), outcome, by=args.get("by"), key=args.get("key"))
        except DecisionError as e:
            return refused(e.reason, str(e))
        except LeaseLostError:
            return refused("fenced", "this owner was fenced out of the session")
        except (TypeError, ValueError) as e:
            return refused("invalid", str(e))
        return {"applied": True, "op": "decide", "decision_id": decision_id, "duplicate": not applied}

    def _remote_resolve(self, args: Dict[str, Any]) -> Dict[str, Any]:
        """Another process recorded the result of a call in doubt (``PostgresStore.resolve``),
        on the store's thread, in order with the staged input around it: recorded by
        :meth:`resolve` here and now, or refused (``not-in-doubt``, with why) and the refusal
        sent back to the caller, which raises it."""
        call_id = args.get("call_id")

        def refused(reason: str, detail: str) -> Dict[str, Any]:
            return {"applied": False, "op": "resolve", "call_id": call_id, "reason": reason, "detail": detail}

        if not self._constructed.wait(_CONSTRUCTION_WAIT):
            return refused("no-loop", "the session's AgentLoop is not set up yet")
        result = ToolResult(str(args.get("text")), is_error=bool(args.get("is_error")))
        try:
            seq = self.resolve(str(call_id), result)
        except LeaseLostError:
            return refused("fenced", "this owner was fenced out of the session")
        except ValueError as e:
            return refused("not-in-doubt", str(e))
        return {"applied": True, "op": "resolve", "call_id": call_id, "seq": seq}

    def _abort_remote(self, reason: Dict[str, Any], turn: int) -> None:
        if self._status == "running" and self.turn == turn:
            self._cancel(reason, True)  # the inbox was cleared (or kept) when the cancel was applied
