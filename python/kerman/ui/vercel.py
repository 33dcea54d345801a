"""The Vercel AI SDK projection: a session log as UI message stream parts (protocol v1).

One UI message per turn (``start`` at ``turn/start``; ``finish``, ``error`` + ``finish`` or
``abort`` at ``turn/end``), ``start-step``/``finish-step`` per loop step, text and reasoning
parts as they were streamed, ``tool-input-available`` and ``tool-output-available`` /
``tool-output-error`` for tool calls, and data parts: ``data-queue`` (the pending inbox, a
transient part replaced on every splice), ``data-prompt``, ``data-steering`` and
``data-context`` (each user message as it enters a step). The mapping is in docs/web.md.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from ._base import EventLike, JsonDict, Projection, QueueMirror, fields, message_dict, public_reason, text_of

__all__ = ["VercelProjection"]

_FINISH = {"completed": "stop", "max-tokens": "length", "blocked": "other"}


class VercelProjection(Projection):
    """Feeds on log events one at a time; ``feed(event)`` returns the stream parts (dicts in
    their wire form) that the event gives."""

    def __init__(self) -> None:
        self.queue = QueueMirror()
        self._turn: Optional[int] = None
        self._step: Optional[int] = None
        self._text: Optional[str] = None
        self._reasoning: Optional[str] = None
        self._streamed = False
        self._calls: dict[str, tuple[str, Any]] = {}
        self._announced: set[str] = set()

    def feed(self, event: EventLike) -> list[JsonDict]:
        seq, type, data = fields(event)
        out: list[JsonDict] = []
        if type == "agent/inbox/spliced":
            self.queue.apply(event)
            out.append({"type": "data-queue", "id": "queue", "data": self.queue.state(), "transient": True})
            return out
        handler = _HANDLERS.get(type)
        if handler is not None:
            handler(self, seq, data, out)
        return out

    def _close_open(self, out: list[JsonDict]) -> None:
        if self._text is not None:
            out.append({"type": "text-end", "id": self._text})
            self._text = None
        if self._reasoning is not None:
            out.append({"type": "reasoning-end", "id": self._reasoning})
            self._reasoning = None

    def _turn_start(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._close_open(out)
        self._turn = data["turn"]
        self._calls.clear()
        self._announced.clear()
        out.append({"type": "start", "messageId": f"turn-{self._turn}"})

    def _step_start(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._step = data.get("step")
        self._streamed = False
        out.append({"type": "start-step"})

    def _step_end(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._close_open(out)
        out.append({"type": "finish-step"})

    def _user_message(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        message = message_dict(data)
        kind = self.queue.entered(message["id"], self._step)
        out.append({"type": f"data-{kind}", "id": message["id"],
                    "data": {"id": message["id"], "text": text_of(message.get("content")), "message": message}})

    def _chunk(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._streamed = True
        chunk = data.get("chunk") or {}
        kind = chunk.get("type")
        if kind == "text-delta":
            if self._reasoning is not None:
                out.append({"type": "reasoning-end", "id": self._reasoning})
                self._reasoning = None
            if self._text is None:
                self._text = f"text-{seq}"
                out.append({"type": "text-start", "id": self._text})
            if chunk.get("text"):
                out.append({"type": "text-delta", "id": self._text, "delta": chunk["text"]})
        elif kind == "reasoning-delta":
            if self._text is not None:
                out.append({"type": "text-end", "id": self._text})
                self._text = None
            if self._reasoning is None:
                self._reasoning = f"reasoning-{seq}"
                out.append({"type": "reasoning-start", "id": self._reasoning})
            if chunk.get("text"):
                out.append({"type": "reasoning-delta", "id": self._reasoning, "delta": chunk["text"]})
        elif kind in ("tool-call", "finish"):  # as in the AG-UI projection
            self._close_open(out)

    def _assistant_message(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._close_open(out)
        message = message_dict(data.get("message") or {})
        blocks = message.get("content") or []
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool-call":
                self._calls[str(block.get("id"))] = (block.get("name", ""), block.get("arguments", ""))
        if not self._streamed:
            reasoning = "\n".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "reasoning")
            if reasoning:
                rid = f"reasoning-{seq}"
                out += [{"type": "reasoning-start", "id": rid}, {"type": "reasoning-delta", "id": rid, "delta": reasoning},
                        {"type": "reasoning-end", "id": rid}]
            text = text_of(blocks)
            if text:
                tid = f"text-{seq}"
                out += [{"type": "text-start", "id": tid}, {"type": "text-delta", "id": tid, "delta": text},
                        {"type": "text-end", "id": tid}]
        self._streamed = False

    def _announce(self, out: list[JsonDict], call_id: str, name: str, arguments: Any) -> None:
        self._announced.add(call_id)
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments else {}
            except ValueError as error:
                out.append({"type": "tool-input-error", "toolCallId": call_id, "toolName": name, "input": arguments,
                            "errorText": f"the arguments are not JSON: {error}"})
                return
        else:
            parsed = arguments
        out.append({"type": "tool-input-available", "toolCallId": call_id, "toolName": name, "input": parsed})

    def _tool_call(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._close_open(out)
        self._announce(out, data["callId"], data.get("name", ""), data.get("arguments", ""))

    def _tool_result(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._close_open(out)
        message = message_dict(data.get("message") or {})
        block = next((b for b in message.get("content") or [] if isinstance(b, dict) and b.get("type") == "tool-result"), {})
        call_id = block.get("toolCallId") or (message.get("source") or {}).get("callId") or ""
        if call_id not in self._announced:
            name, arguments = self._calls.get(call_id, ("", ""))
            self._announce(out, call_id, name, arguments)
        text = text_of(block.get("content"))
        if block.get("isError") or data.get("error"):
            out.append({"type": "tool-output-error", "toolCallId": call_id, "errorText": text or "the tool failed"})
        else:
            out.append({"type": "tool-output-available", "toolCallId": call_id, "output": text})

    def _turn_end(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._close_open(out)
        reason = data.get("reason") or {}
        kind = reason.get("kind")
        turn = self._turn if self._turn is not None else data.get("turn")
        self._turn = None
        self._step = None
        metadata = {"turn": turn, "reason": public_reason(reason)}
        if kind == "aborted":
            cause = reason.get("reason")
            text = cause.get("kind") if isinstance(cause, dict) else None
            out.append({"type": "abort", **({"reason": str(text)} if text else {})})
        elif kind in ("error", "interrupted"):
            error = reason.get("error") or {}
            message = error.get("message") if kind == "error" else "the turn was interrupted: the process running it stopped"
            out.append({"type": "error", "errorText": str(message or "the turn failed")})
            out.append({"type": "finish", "finishReason": "error", "messageMetadata": metadata})
        else:
            out.append({"type": "finish", "finishReason": _FINISH.get(str(kind), "other"), "messageMetadata": metadata})


_HANDLERS = {
    "turn/start": VercelProjection._turn_start,
    "step/start": VercelProjection._step_start,
    "step/end": VercelProjection._step_end,
    "user/message": VercelProjection._user_message,
    "assistant/chunk": VercelProjection._chunk,
    "assistant/message": VercelProjection._assistant_message,
    "tool/call": VercelProjection._tool_call,
    "tool/result": VercelProjection._tool_result,
    "turn/end": VercelProjection._turn_end,
}
