"""The turn's synchronous helpers (reference 5.5–5.7, SPEC D1–D9).

The turn loop and the step are ``kerman._core.Driver``; it calls ``_decision``,
``failure_of``, ``error_chain``, ``emit_error``, ``_uncancel`` and ``_Assembler`` from here,
raises ``TurnFailure`` and ``_Aborted``, and awaits the coroutine ``_tools.run_tools`` returns for a step's tool calls.

User code (listeners, the model, serial hooks) is awaited so that ``cancel()`` can throw
``CancelledError`` into it: the driver sets ``loop._in_user`` around each such await. A
cancellation it threw (``loop._thrown``) is absorbed and surfaces as the aborted signal
(``_Aborted``); a ``CancelledError`` raised by user code with no cancellation in progress is a
failure (SPEC 4.4); any other propagates (the driver was cancelled from outside).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ._core import NEXT_STEP, NEXT_TURN, Message, UserMessage
from ._report import describe, turn_failed
from .errors import LeaseLostError, LoopError, ModelError
from .types import Enter, Reject

if TYPE_CHECKING:
    from .loop import AgentLoop

_log = logging.getLogger("kerman")


class _Aborted(Exception):
    """The turn's signal aborted; the turn ends ``aborted`` with the signal's reason."""


class TurnFailure(Exception):
    """A failure the turn ends with, carrying its failure dict."""

    def __init__(self, failure: Dict[str, Any], cause: Optional[BaseException] = None) -> None:
        super().__init__(failure.get("message", ""))
        self.failure = failure
        self.cause = cause


def error_chain(exc: BaseException) -> str:
    """The exception's message (or class name), then its cause chain."""
    parts: List[str] = []
    seen = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        try:
            text = str(current) or type(current).__name__
        except Exception:
            text = "<unrenderable value>"
        if not parts or parts[-1] != text:
            parts.append(text)
        current = current.__cause__
    return ": ".join(parts)


def failure_of(exc: BaseException) -> Dict[str, Any]:
    """The failure dict of an exception (what ``turn/end {kind: "error"}`` carries): its
    message and code, and for an exception raised in user code, the exception type, the user
    function and the traceback text (``_report.describe``)."""
    if isinstance(exc, TurnFailure):
        if exc.cause is None or "traceback" in exc.failure:
            return exc.failure
        return {**exc.failure, **describe(exc.cause)}
    if isinstance(exc, ModelError):
        failure: Dict[str, Any] = {"message": exc.message or type(exc).__name__, "code": exc.code}
        for key, value in (("status", exc.status), ("retryAfterMs", exc.retry_after_ms), ("requestId", exc.request_id)):
            if value is not None:
                failure[key] = value
        return {**failure, **describe(exc)}
    return {"message": error_chain(exc), "code": "UNKNOWN", **describe(exc)}


def _uncancel(loop: "AgentLoop") -> None:
    loop._thrown = False
    task = asyncio.current_task()
    if task is not None and sys.version_info >= (3, 11):
        while task.cancelling():
            task.uncancel()


def emit_error(loop: "AgentLoop", turn: int, failure: Dict[str, Any], exc: Optional[BaseException]) -> None:
    """Reports the failure turn ``turn`` ends with: logged, ``agent/error``, ``last_error``."""
    turn_failed(loop, turn, failure, exc)


def lease_lost(exc: BaseException) -> Optional[LeaseLostError]:
    """The ``LeaseLostError`` behind a turn's exception, if that is what ended it."""
    if isinstance(exc, LeaseLostError):
        return exc
    if isinstance(exc, TurnFailure) and isinstance(exc.cause, LeaseLostError):
        return exc.cause
    return None


def fence(loop: "AgentLoop", turn: int, exc: BaseException) -> bool:
    """Issue 6: another owner took the session over. Aborts the turn's signal with cause
    ``{"kind": "fenced"}``, reports one ``agent/error`` (code ``FENCED``) and marks the loop
    fenced, so it refuses further input. The driver then appends nothing more: the session is
    the new owner's, whose ``open`` closed this turn. ``False`` for any other exception."""
    lost = lease_lost(exc)
    if lost is None:
        return False
    loop._signal._abort({"kind": "fenced"})
    if loop._fenced is None:
        loop._fenced = lost
        emit_error(loop, turn, {"message": error_chain(lost), "code": "FENCED"}, lost)
    return True


def _decision(value: Any) -> Tuple[str, Any]:
    kind = getattr(value, "kind", None) if not isinstance(value, dict) else value.get("kind")
    if kind == "enter" and isinstance(value, (Enter, dict)):
        raw = value.messages if isinstance(value, Enter) else value.get("messages")
        if isinstance(raw, (list, tuple)) and all(isinstance(m, (UserMessage, str)) for m in raw):
            return "enter", [m if isinstance(m, UserMessage) else UserMessage(m) for m in raw]
    elif kind == "reject" and isinstance(value, (Reject, dict)):
        reason = value.reason if isinstance(value, Reject) else value.get("reason")
        if reason is None or isinstance(reason, str):
            return "reject", reason
    raise TurnFailure({"message": f"pre-step listener returned {value!r}; expected Enter or Reject",
                       "code": "INVALID_DECISION"})


# ---- the step ------------------------------------------------------------------------------

class _Assembler:
    """Builds the assistant content from stream chunks."""

    def __init__(self) -> None:
        self.blocks: List[Dict[str, Any]] = []
        self.open: Optional[str] = None
        self.usage: Optional[Dict[str, Any]] = None
        self.finish = "stop"
        self.error: Optional[Dict[str, Any]] = None

    def feed(self, chunk: Dict[str, Any]) -> None:
        kind = chunk.get("type")
        if kind in ("text-delta", "reasoning-delta"):
            block_type = "text" if kind == "text-delta" else "reasoning"
            text = chunk.get("text", "")
            if self.open == block_type:
                self.blocks[-1]["text"] += text
            else:
                self.blocks.append({"type": block_type, "text": text})
                self.open = block_type
        elif kind == "tool-call":
            self.blocks.append({"type": "tool-call", "id": chunk.get("id"), "name": chunk.get("name"),
                                "arguments": chunk.get("arguments", "")})
            self.open = None
        elif kind == "usage":
            self.usage = {**(self.usage or {}), **{k: v for k, v in chunk.items() if k != "type"}}
        elif kind == "finish":
            self.finish = chunk.get("reason", "stop")
            error = chunk.get("error")
            self.error = dict(error) if isinstance(error, dict) else None

    def visible(self) -> List[Dict[str, Any]]:
        return [b for b in self.blocks if b["type"] in ("text", "reasoning")]


# ---- recovery ------------------------------------------------------------------------------

def requeue_claimed(loop: "AgentLoop", turn: int) -> List[UserMessage]:
    """SPEC D9: re-insert, at the head of the list each came from and in claim order, the
    messages finished turn ``turn`` claimed that never appeared after the claim."""
    lists: Dict[str, List[Dict[str, Any]]] = {NEXT_TURN: [], NEXT_STEP: []}
    claimed: List[Tuple[str, Dict[str, Any], int]] = []
    # Claims are pure deletions: rebuild the lists to know what each one removed.
    seen_ids: Dict[str, int] = {}
    state = "unknown"
    for event in loop._log.events():
        data = event.data
        if event.type == "turn/start" and data.get("turn") == turn:
            state = "open"
        elif event.type == "turn/end" and data.get("turn") == turn and state == "open":
            state = "ended"
        elif event.type == "agent/inbox/spliced":
            items = lists[data["target"]]
            start, removed = data["start"], data.get("removedCount", 0)
            gone = items[start:start + removed]
            items[start:start + removed] = data["inserted"]
            if state == "open" and removed and data.get("outcome") != "canceled":
                claimed.extend((data["target"], m, event.seq) for m in gone)
            for m in data["inserted"]:
                seen_ids[m["id"]] = event.seq
        elif event.type == "user/message":
            seen_ids[data["id"]] = event.seq
    if state == "unknown":
        raise LoopError(f"turn {turn} is not in this log")
    if state == "open":
        raise LoopError(f"turn {turn} is still open")
    missing = [(t, m) for t, m, seq in claimed if seen_ids.get(m["id"], -1) <= seq]
    if not missing:
        raise LoopError(f"turn {turn} has nothing left to requeue")
    out: List[UserMessage] = []
    for target in (NEXT_STEP, NEXT_TURN):
        messages = [m for m in (Message.from_dict(d) for t, d in missing if t == target) if isinstance(m, UserMessage)]
        if messages:
            loop._inbox.splice(target, 0, 0, messages)
            out.extend(messages)
    return out
