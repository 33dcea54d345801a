"""The Vercel AI SDK projection: a session log as UI message stream parts (protocol v1).

One UI message per turn (``start`` at ``turn/start``; ``finish``, ``error`` + ``finish`` or
``abort`` at ``turn/end``), ``start-step``/``finish-step`` per loop step, text and reasoning
parts as they were streamed, ``tool-input-available`` and ``tool-output-available`` /
``tool-output-error`` for tool calls, and data parts: ``data-queue`` (the pending inbox, a
transient part replaced on every splice), ``data-prompt``, ``data-steering`` and
``data-context`` (each user message as it enters a step). What to show is the shared fold's
(``_fold.py``); this module only maps its parts. The mapping is in docs/web.md.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List

from . import _fold as f
from ._base import EventLike, JsonDict, Projection, public_reason

__all__ = ["VercelProjection"]

_FINISH = {"completed": "stop", "max-tokens": "length", "blocked": "other"}


class VercelProjection(Projection):
    """Feeds on log events one at a time; ``feed(event)`` returns the stream parts (dicts in
    their wire form) that the event gives."""

    def __init__(self) -> None:
        self.fold = f.UiFold()
        self.queue = self.fold.queue

    def feed(self, event: EventLike) -> List[JsonDict]:
        out: List[JsonDict] = []
        for part in self.fold.feed(event):
            _MAP[type(part)](self, part, out)
        return out

    def _queue(self, part: f.QueueChanged, out: List[JsonDict]) -> None:
        out.append({"type": "data-queue", "id": "queue", "data": self.queue.state(), "transient": True})

    def _turn_started(self, part: f.TurnStarted, out: List[JsonDict]) -> None:
        out.append({"type": "start", "messageId": f"turn-{part.turn}"})

    def _step_started(self, part: f.StepStarted, out: List[JsonDict]) -> None:
        out.append({"type": "start-step"})

    def _step_finished(self, part: f.StepFinished, out: List[JsonDict]) -> None:
        out.append({"type": "finish-step"})

    def _user(self, part: f.UserEntered, out: List[JsonDict]) -> None:
        message_id = part.message["id"]
        out.append({"type": f"data-{part.kind}", "id": message_id,
                    "data": {"id": message_id, "text": part.text, "message": part.message}})

    def _started(self, part: f.PartStarted, out: List[JsonDict]) -> None:
        out.append({"type": f"{part.kind}-start", "id": f"{part.kind}-{part.seq}"})

    def _delta(self, part: f.PartDelta, out: List[JsonDict]) -> None:
        out.append({"type": f"{part.kind}-delta", "id": f"{part.kind}-{part.seq}", "delta": part.text})

    def _ended(self, part: f.PartEnded, out: List[JsonDict]) -> None:
        out.append({"type": f"{part.kind}-end", "id": f"{part.kind}-{part.seq}"})

    def _whole_reasoning(self, part: f.WholeReasoning, out: List[JsonDict]) -> None:
        rid = f"reasoning-{part.seq}"
        out += [{"type": "reasoning-start", "id": rid}, {"type": "reasoning-delta", "id": rid, "delta": part.text},
                {"type": "reasoning-end", "id": rid}]

    def _whole_text(self, part: f.WholeText, out: List[JsonDict]) -> None:
        tid = f"text-{part.seq}"
        out += [{"type": "text-start", "id": tid}, {"type": "text-delta", "id": tid, "delta": part.text},
                {"type": "text-end", "id": tid}]

    def _call(self, part: f.ToolCallAnnounced, out: List[JsonDict]) -> None:
        arguments = part.arguments
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments else {}
            except ValueError as error:
                out.append({"type": "tool-input-error", "toolCallId": part.call_id, "toolName": part.name,
                            "input": arguments, "errorText": f"the arguments are not JSON: {error}"})
                return
        else:
            parsed = arguments
        out.append({"type": "tool-input-available", "toolCallId": part.call_id, "toolName": part.name, "input": parsed})

    def _answered(self, part: f.ToolAnswered, out: List[JsonDict]) -> None:
        if part.is_error:
            out.append({"type": "tool-output-error", "toolCallId": part.call_id, "errorText": part.text or "the tool failed"})
        else:
            out.append({"type": "tool-output-available", "toolCallId": part.call_id, "output": part.text})

    def _unread(self, part: f.Unread, out: List[JsonDict]) -> None:
        """Not a part of this protocol: the queue parts already show the input is gone."""

    def _turn_ended(self, part: f.TurnEnded, out: List[JsonDict]) -> None:
        ending = part.ending
        kind = ending.kind
        metadata = {"turn": part.turn, "reason": public_reason(ending.raw)}
        if kind == "aborted":
            cause = ending.cause
            text = cause.kind if cause is not None else None
            out.append({"type": "abort", **({"reason": text} if text else {})})
        elif kind in ("error", "interrupted"):
            error = ending.error
            message = (error.message if error else "") if kind == "error" else "the turn was interrupted: the process running it stopped"
            out.append({"type": "error", "errorText": message or "the turn failed"})
            out.append({"type": "finish", "finishReason": "error", "messageMetadata": metadata})
        else:
            out.append({"type": "finish", "finishReason": _FINISH.get(str(kind), "other"), "messageMetadata": metadata})


_MAP: Dict[type, Callable[[VercelProjection, Any, List[JsonDict]], None]] = {
    f.QueueChanged: VercelProjection._queue,
    f.TurnStarted: VercelProjection._turn_started,
    f.StepStarted: VercelProjection._step_started,
    f.StepFinished: VercelProjection._step_finished,
    f.UserEntered: VercelProjection._user,
    f.PartStarted: VercelProjection._started,
    f.PartDelta: VercelProjection._delta,
    f.PartEnded: VercelProjection._ended,
    f.WholeReasoning: VercelProjection._whole_reasoning,
    f.WholeText: VercelProjection._whole_text,
    f.ToolCallAnnounced: VercelProjection._call,
    f.ToolAnswered: VercelProjection._answered,
    f.Unread: VercelProjection._unread,
    f.TurnEnded: VercelProjection._turn_ended,
}
