"""The step algorithm and the turn's helpers (reference 5.5–5.7, SPEC D1–D8).

The turn loop itself is ``kerman._core.Driver``; it calls ``begin_turn``, ``_decision``,
``failure_of``, ``emit_error``, ``_uncancel`` and awaits ``run_step`` from here, and follows
``user_await``'s rules for the seams it awaits itself (``pre_step``, ``turn_stopping``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import _dispatch, _tools
from ._core import NEXT_STEP, NEXT_TURN, AssistantMessage, Message, UserMessage
from .errors import LoopError, ModelError
from .types import Enter, ModelReply, ModelRequest, Reject, RequestFailure, Retry

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
    if isinstance(exc, TurnFailure):
        return exc.failure
    if isinstance(exc, ModelError):
        failure: Dict[str, Any] = {"message": exc.message or type(exc).__name__, "code": exc.code}
        for key, value in (("status", exc.status), ("retryAfterMs", exc.retry_after_ms), ("requestId", exc.request_id)):
            if value is not None:
                failure[key] = value
        return failure
    return {"message": error_chain(exc), "code": "UNKNOWN"}


def check(loop: "AgentLoop") -> None:
    if loop._signal.aborted:
        raise _Aborted()


async def user_await(loop: "AgentLoop", awaitable: Any) -> Any:
    """Awaits user code (a listener, the model, a serial hook) so that ``cancel()`` can throw
    ``CancelledError`` into it. A cancellation we threw is absorbed here and surfaces as the
    aborted signal; one we did not throw propagates (the driver was cancelled from outside)."""
    loop._in_user = True
    try:
        result = await awaitable
    except asyncio.CancelledError as exc:
        if loop._thrown:
            _uncancel(loop)
            raise _Aborted() from None
        task = asyncio.current_task()
        if sys.version_info >= (3, 11) and task is not None and not task.cancelling():
            # Raised by user code itself, with no cancellation in progress: a failure (SPEC 4.4).
            raise TurnFailure({"message": error_chain(exc), "code": "UNKNOWN"}, exc) from exc
        raise
    finally:
        loop._in_user = False
    if loop._thrown:
        # The throw may still be pending (the code returned before awaiting): consume it.
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass
        _uncancel(loop)
    return result


def _uncancel(loop: "AgentLoop") -> None:
    loop._thrown = False
    task = asyncio.current_task()
    if task is not None and sys.version_info >= (3, 11):
        while task.cancelling():
            task.uncancel()


def emit_error(loop: "AgentLoop", turn: int, failure: Dict[str, Any], exc: Optional[BaseException]) -> None:
    loop._emit("agent/error", turn=turn, step=loop._step, error=failure, exception=exc)


def begin_turn(loop: "AgentLoop") -> Optional[Tuple[int, Optional[List[UserMessage]], Optional[BaseException]]]:
    """The synchronous prefix of a turn: ``turn/start`` then the first claim (reference 5.5
    steps 1–3, 5.6 step 1). ``None`` when no turn was recorded."""
    if loop._signal.aborted:
        return None
    turn = loop._turn + 1
    try:
        loop._log._append_owned("turn/start", {"turn": turn})
    except Exception as exc:
        emit_error(loop, loop._turn, failure_of(exc), exc)
        return None
    loop._turn = turn
    try:
        return turn, loop._inbox.claim(NEXT_TURN, turn), None
    except Exception as exc:
        return turn, None, exc


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

def history(loop: "AgentLoop") -> List[Message]:
    """The derived history: user, assistant and tool-result messages in log order (assistant
    messages with empty content are kept in the log but left out). Extended incrementally."""
    messages, loop._history_pos = loop._log._surface_messages(loop._history_pos)
    loop._history.extend(messages)
    return list(loop._history)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


async def run_step(loop: "AgentLoop", turn: int, step: int, entered: List[UserMessage]) -> Optional[str]:
    """One step: request (with retries in the same step, D1), tools. Returns ``"completed"``,
    ``"max-tokens"`` or ``None`` when tool results are owed another request."""
    while True:
        request = ModelRequest(history(loop), [t.spec() for t in loop._tools.values()], dict(loop._options),
                               turn, step, loop._signal, list(entered), loop)
        request = await user_await(loop, _dispatch.waterfall(loop._before_request, request, lambda: request))
        check(loop)
        if not isinstance(request, ModelRequest):
            raise TurnFailure({"message": f"before_request listener returned {request!r}; expected a ModelRequest",
                               "code": "INVALID_REQUEST"})
        options = _canonical(request.options)
        if loop._requests == 0 or options != loop._last_options:
            loop._log._append_owned("request/header", {"options": request.options})
            loop._last_options = options
        loop._requests += 1
        if loop._log._checkpoints:
            await loop._log.flush()
            check(loop)
        outcome = await _call_model(loop, request, turn, step)
        if isinstance(outcome, dict):  # a failure
            failure, exc = outcome["failure"], outcome["exception"]
            payload = RequestFailure(loop, turn, step, failure, exc, loop._signal)
            action = await user_await(loop, _dispatch.waterfall(loop._request_error, payload, lambda: None))
            check(loop)
            if isinstance(action, Retry) or (isinstance(action, dict) and action.get("kind") == "retry"):
                continue
            raise TurnFailure(failure, exc)
        content, usage, finish, seqs = outcome
        if finish == "max-tokens":
            content = [b for b in content if b.get("type") != "tool-call"]
        message = AssistantMessage(content)
        data: Dict[str, Any] = {"turn": turn, "step": step, "message": message.to_dict()}
        if usage is not None:
            data["usage"] = usage
        loop._log._append_owned("assistant/message", data, seqs)
        if finish == "max-tokens":
            return "max-tokens"
        calls = [b for b in content if b.get("type") == "tool-call"]
        if not calls:
            return "completed"
        concludes = await _tools.run_tools(loop, turn, step, calls)
        return "completed" if concludes else None


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


async def _call_model(loop: "AgentLoop", request: ModelRequest, turn: int, step: int) -> Any:
    """Calls the model once. Returns ``(content, usage, finish, chunk_seqs)`` or, for a model
    failure, ``{"failure", "exception"}``."""
    try:
        produced = loop._model(request)
    except ModelError as exc:
        return {"failure": failure_of(exc), "exception": exc}
    if hasattr(produced, "__anext__"):
        return await _stream(loop, produced, turn, step)
    try:
        reply = await user_await(loop, produced)
    except ModelError as exc:
        return {"failure": failure_of(exc), "exception": exc}
    if isinstance(reply, str):
        reply = ModelReply(reply)
    if not isinstance(reply, ModelReply):
        raise TurnFailure({"message": f"model returned {reply!r}; expected a ModelReply", "code": "INVALID_REPLY"})
    return reply.content, reply.usage, reply.finish, []


async def _stream(loop: "AgentLoop", stream: Any, turn: int, step: int) -> Any:
    assembler = _Assembler()
    seqs: List[int] = []
    try:
        while True:
            try:
                chunk = await user_await(loop, stream.__anext__())
            except StopAsyncIteration:
                break
            check(loop)
            if not isinstance(chunk, dict) or not isinstance(chunk.get("type"), str):
                raise TurnFailure({"message": f"model stream yielded {chunk!r}; expected a chunk dict", "code": "INVALID_REPLY"})
            event = loop._log._append_owned("assistant/chunk", {"turn": turn, "step": step, "chunk": chunk})
            seqs.append(event.seq)
            assembler.feed(chunk)
    except ModelError as exc:
        return {"failure": failure_of(exc), "exception": exc}
    except BaseException:
        if loop._signal.aborted and assembler.visible():
            data: Dict[str, Any] = {"turn": turn, "step": step,
                                    "message": AssistantMessage(assembler.visible()).to_dict(), "interrupted": True}
            if assembler.usage is not None:
                data["usage"] = assembler.usage
            loop._log._append_owned("assistant/message", data, seqs)
        await _close_stream(stream)
        raise
    if assembler.finish not in ("stop", "max-tokens"):
        failure = dict(assembler.error or {})
        failure.setdefault("message", f"model finished with reason {assembler.finish!r}")
        failure.setdefault("code", "UNKNOWN")
        return {"failure": failure, "exception": None}
    return assembler.blocks, assembler.usage, assembler.finish, seqs


async def _close_stream(stream: Any) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except BaseException:
            pass


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
