"""The AG-UI projection: a session log as AG-UI events (https://docs.ag-ui.com).

One run per turn (``RUN_STARTED`` at ``turn/start``, ``RUN_FINISHED`` or ``RUN_ERROR`` at
``turn/end``), one AG-UI step per loop step, streamed text and reasoning as they were chunked,
tool calls with their results, user messages as ``user`` text messages, and the queue as shared
state (``STATE_SNAPSHOT`` once, then a JSON Patch ``STATE_DELTA`` per inbox splice). What to show
is the shared fold's (``_fold.py``); this module only maps its parts. The mapping is written
down in docs/web.md.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List

from .._core import Event
from . import _fold as f
from ._base import EventLike, JsonDict, Projection, public_reason

__all__ = ["AgUiProjection"]

_LIST_KEYS = {"next-turn": "nextTurn", "next-step": "nextStep"}


class AgUiProjection(Projection):
    """Feeds on log events one at a time; ``feed(event)`` returns the AG-UI events (dicts in
    their wire form, camelCase) that the event gives. The state it keeps is derived from the
    events fed so far and nothing else."""

    def __init__(self, thread_id: str = "session") -> None:
        self.thread_id = thread_id
        self.fold = f.UiFold()
        self.queue = self.fold.queue
        self._snapshot_sent = False
        self._time = 0

    def _ev(self, type: str, **fields: Any) -> JsonDict:
        return {"type": type, "timestamp": self._time, **fields}

    def feed(self, event: EventLike) -> List[JsonDict]:
        parts = self.fold.feed(event)
        out: List[JsonDict] = []
        if parts:
            self._time = event.time if event.__class__ is Event else int(event.get("time", 0))  # type: ignore[union-attr]
            for part in parts:
                _MAP[type(part)](self, part, out)
        return out

    def _text_message(self, out: List[JsonDict], message_id: str, role: str, text: str) -> None:
        out.append(self._ev("TEXT_MESSAGE_START", messageId=message_id, role=role))
        if text:
            out.append(self._ev("TEXT_MESSAGE_CONTENT", messageId=message_id, delta=text))
        out.append(self._ev("TEXT_MESSAGE_END", messageId=message_id))

    def _queue(self, part: f.QueueChanged, out: List[JsonDict]) -> None:
        for message_id in part.requeued:
            out.append(self._ev("CUSTOM", name="kerman.requeued", value={"messageId": message_id}))
        if not self._snapshot_sent:
            self._snapshot_sent = True
            out.append(self._ev("STATE_SNAPSHOT", snapshot={"queue": self.queue.state()}))
            return
        path = f"/queue/{_LIST_KEYS[part.target]}"
        ops: List[JsonDict] = [{"op": "remove", "path": f"{path}/{part.start}"} for _ in part.removed]
        ops += [{"op": "add", "path": f"{path}/{part.start + i}", "value": row} for i, row in enumerate(part.inserted)]
        out.append(self._ev("STATE_DELTA", delta=ops))

    def _turn_started(self, part: f.TurnStarted, out: List[JsonDict]) -> None:
        out.append(self._ev("RUN_STARTED", threadId=self.thread_id, runId=f"turn-{part.turn}"))

    def _step_started(self, part: f.StepStarted, out: List[JsonDict]) -> None:
        out.append(self._ev("STEP_STARTED", stepName=f"step-{part.step}"))

    def _step_finished(self, part: f.StepFinished, out: List[JsonDict]) -> None:
        out.append(self._ev("STEP_FINISHED", stepName=f"step-{part.step}"))

    def _user(self, part: f.UserEntered, out: List[JsonDict]) -> None:
        message_id = part.message["id"]
        if part.kind != "prompt":
            out.append(self._ev("CUSTOM", name=f"kerman.{part.kind}", value={"messageId": message_id, "message": part.message}))
        self._text_message(out, message_id, "user", part.text)

    def _started(self, part: f.PartStarted, out: List[JsonDict]) -> None:
        if part.kind == "text":
            out.append(self._ev("TEXT_MESSAGE_START", messageId=f"msg-{part.seq}", role="assistant"))
        else:
            out.append(self._ev("REASONING_START", messageId=f"reasoning-{part.seq}"))
            out.append(self._ev("REASONING_MESSAGE_START", messageId=f"reasoning-{part.seq}", role="reasoning"))

    def _delta(self, part: f.PartDelta, out: List[JsonDict]) -> None:
        if part.kind == "text":
            out.append(self._ev("TEXT_MESSAGE_CONTENT", messageId=f"msg-{part.seq}", delta=part.text))
        else:
            out.append(self._ev("REASONING_MESSAGE_CONTENT", messageId=f"reasoning-{part.seq}", delta=part.text))

    def _ended(self, part: f.PartEnded, out: List[JsonDict]) -> None:
        if part.kind == "text":
            out.append(self._ev("TEXT_MESSAGE_END", messageId=f"msg-{part.seq}"))
        else:
            out.append(self._ev("REASONING_MESSAGE_END", messageId=f"reasoning-{part.seq}"))
            out.append(self._ev("REASONING_END", messageId=f"reasoning-{part.seq}"))

    def _whole_reasoning(self, part: f.WholeReasoning, out: List[JsonDict]) -> None:
        message_id = f"reasoning-{part.seq}"
        out.append(self._ev("REASONING_START", messageId=message_id))
        out.append(self._ev("REASONING_MESSAGE_START", messageId=message_id, role="reasoning"))
        out.append(self._ev("REASONING_MESSAGE_CONTENT", messageId=message_id, delta=part.text))
        out.append(self._ev("REASONING_MESSAGE_END", messageId=message_id))
        out.append(self._ev("REASONING_END", messageId=message_id))

    def _whole_text(self, part: f.WholeText, out: List[JsonDict]) -> None:
        self._text_message(out, part.message_id, "assistant", part.text)

    def _call(self, part: f.ToolCallAnnounced, out: List[JsonDict]) -> None:
        arguments = part.arguments
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        start = self._ev("TOOL_CALL_START", toolCallId=part.call_id, toolCallName=part.name)
        if part.parent is not None:
            start["parentMessageId"] = part.parent
        out.append(start)
        if arguments:
            out.append(self._ev("TOOL_CALL_ARGS", toolCallId=part.call_id, delta=arguments))
        out.append(self._ev("TOOL_CALL_END", toolCallId=part.call_id))

    def _answered(self, part: f.ToolAnswered, out: List[JsonDict]) -> None:
        result = self._ev("TOOL_CALL_RESULT", messageId=part.message_id, toolCallId=part.call_id, content=part.text,
                          role="tool")
        if part.is_error:
            result["metadata"] = {"kerman": {"isError": True, **({"error": part.error} if part.error else {})}}
        out.append(result)

    def _unread(self, part: f.Unread, out: List[JsonDict]) -> None:
        out.append(self._ev("CUSTOM", name="kerman.unread", value={
            "messageId": part.row["id"], "text": part.row["text"], "placement": part.row["placement"],
            "turn": part.turn, "reason": public_reason(part.reason)}))

    def _turn_ended(self, part: f.TurnEnded, out: List[JsonDict]) -> None:
        ending = part.ending
        kind = ending.kind
        if kind == "error":
            error = ending.error
            failure = self._ev("RUN_ERROR", message=(error.message if error else "") or "the turn failed")
            if error is not None and error.code:
                failure["code"] = error.code
            out.append(failure)
        elif kind == "interrupted":
            out.append(self._ev("RUN_ERROR", message="the turn was interrupted: the process running it stopped",
                                code="INTERRUPTED"))
        else:
            outcome = {"type": "cancelled"} if kind == "aborted" else {"type": "success"}
            out.append(self._ev("RUN_FINISHED", threadId=self.thread_id, runId=f"turn-{part.turn}", outcome=outcome,
                                result={"reason": public_reason(ending.raw)}))


_MAP: Dict[type, Callable[[AgUiProjection, Any, List[JsonDict]], None]] = {
    f.QueueChanged: AgUiProjection._queue,
    f.TurnStarted: AgUiProjection._turn_started,
    f.StepStarted: AgUiProjection._step_started,
    f.StepFinished: AgUiProjection._step_finished,
    f.UserEntered: AgUiProjection._user,
    f.PartStarted: AgUiProjection._started,
    f.PartDelta: AgUiProjection._delta,
    f.PartEnded: AgUiProjection._ended,
    f.WholeReasoning: AgUiProjection._whole_reasoning,
    f.WholeText: AgUiProjection._whole_text,
    f.ToolCallAnnounced: AgUiProjection._call,
    f.ToolAnswered: AgUiProjection._answered,
    f.Unread: AgUiProjection._unread,
    f.TurnEnded: AgUiProjection._turn_ended,
}
