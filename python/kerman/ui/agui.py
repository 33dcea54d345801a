"""The AG-UI projection: a session log as AG-UI events (https://docs.ag-ui.com).

One run per turn (``RUN_STARTED`` at ``turn/start``, ``RUN_FINISHED`` or ``RUN_ERROR`` at
``turn/end``), one AG-UI step per loop step, streamed text and reasoning as they were chunked,
tool calls with their results, user messages as ``user`` text messages, and the queue as shared
state (``STATE_SNAPSHOT`` once, then a JSON Patch ``STATE_DELTA`` per inbox splice). The mapping
is written down in docs/web.md.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .._core import Event
from ._base import EventLike, JsonDict, Projection, QueueMirror, fields, message_dict, public_reason, text_of

__all__ = ["AgUiProjection"]

_LIST_KEYS = {"next-turn": "nextTurn", "next-step": "nextStep"}


class AgUiProjection(Projection):
    """Feeds on log events one at a time; ``feed(event)`` returns the AG-UI events (dicts in
    their wire form, camelCase) that the event gives. The state it keeps is derived from the
    events fed so far and nothing else."""

    def __init__(self, thread_id: str = "session") -> None:
        self.thread_id = thread_id
        self.queue = QueueMirror()
        self._snapshot_sent = False
        self._run: Optional[str] = None
        self._step: Optional[int] = None
        self._text: Optional[str] = None  # the open assistant text message
        self._reasoning: Optional[str] = None  # the open reasoning message
        self._streamed = False  # chunks since the last assistant/message (or step start)
        self._parent: Optional[str] = None  # the last assistant message, for tool calls
        self._calls: dict[str, tuple[str, str]] = {}  # call id -> (name, arguments) of this run's tool-call blocks
        self._announced: set[str] = set()
        self._time = 0
        self._event: EventLike = {}

    def _ev(self, type: str, **fields: Any) -> JsonDict:
        return {"type": type, "timestamp": self._time, **fields}

    def feed(self, event: EventLike) -> list[JsonDict]:
        seq, type, data = fields(event)
        self._event = event
        self._time = event.time if isinstance(event, Event) else int(event.get("time", 0))
        out: list[JsonDict] = []
        handler = _HANDLERS.get(type)
        if handler is not None:
            handler(self, seq, data, out)
        return out

    # -- text and reasoning ------------------------------------------------------------------

    def _close_text(self, out: list[JsonDict]) -> None:
        if self._text is not None:
            out.append(self._ev("TEXT_MESSAGE_END", messageId=self._text))
            self._text = None

    def _close_reasoning(self, out: list[JsonDict]) -> None:
        if self._reasoning is not None:
            out.append(self._ev("REASONING_MESSAGE_END", messageId=self._reasoning))
            out.append(self._ev("REASONING_END", messageId=self._reasoning))
            self._reasoning = None

    def _close_open(self, out: list[JsonDict]) -> None:
        self._close_text(out)
        self._close_reasoning(out)

    def _text_message(self, out: list[JsonDict], message_id: str, role: str, text: str) -> None:
        out.append(self._ev("TEXT_MESSAGE_START", messageId=message_id, role=role))
        if text:
            out.append(self._ev("TEXT_MESSAGE_CONTENT", messageId=message_id, delta=text))
        out.append(self._ev("TEXT_MESSAGE_END", messageId=message_id))

    def _reasoning_message(self, out: list[JsonDict], message_id: str, text: str) -> None:
        out.append(self._ev("REASONING_START", messageId=message_id))
        out.append(self._ev("REASONING_MESSAGE_START", messageId=message_id, role="reasoning"))
        if text:
            out.append(self._ev("REASONING_MESSAGE_CONTENT", messageId=message_id, delta=text))
        out.append(self._ev("REASONING_MESSAGE_END", messageId=message_id))
        out.append(self._ev("REASONING_END", messageId=message_id))

    # -- handlers ------------------------------------------------------------------------------

    def _spliced(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        target, start, removed, inserted = self.queue.apply(self._event)
        for message_id in self.queue.requeued(inserted):
            out.append(self._ev("CUSTOM", name="kerman.requeued", value={"messageId": message_id}))
        if not self._snapshot_sent:
            self._snapshot_sent = True
            out.append(self._ev("STATE_SNAPSHOT", snapshot={"queue": self.queue.state()}))
            return
        path = f"/queue/{_LIST_KEYS[target]}"
        ops: list[JsonDict] = [{"op": "remove", "path": f"{path}/{start}"} for _ in removed]
        ops += [{"op": "add", "path": f"{path}/{start + i}", "value": row} for i, row in enumerate(inserted)]
        out.append(self._ev("STATE_DELTA", delta=ops))

    def _turn_start(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        if self._run is not None:  # a log without the turn's end (fed from the middle): close it
            self._close_open(out)
        self._run = f"turn-{data['turn']}"
        self._calls.clear()
        self._announced.clear()
        out.append(self._ev("RUN_STARTED", threadId=self.thread_id, runId=self._run))

    def _step_start(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self.queue.step_started()
        self._step = data.get("step")
        self._streamed = False
        out.append(self._ev("STEP_STARTED", stepName=f"step-{self._step}"))

    def _step_end(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._close_open(out)
        out.append(self._ev("STEP_FINISHED", stepName=f"step-{data.get('step')}"))

    def _user_message(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        message = message_dict(data)
        kind = self.queue.entered(message["id"], self._step)
        if kind != "prompt":
            out.append(self._ev("CUSTOM", name=f"kerman.{kind}", value={"messageId": message["id"], "message": message}))
        self._text_message(out, message["id"], "user", text_of(message.get("content")))

    def _chunk(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._streamed = True
        chunk = data.get("chunk") or {}
        kind = chunk.get("type")
        if kind == "text-delta":
            self._close_reasoning(out)
            if self._text is None:
                self._text = f"msg-{seq}"
                out.append(self._ev("TEXT_MESSAGE_START", messageId=self._text, role="assistant"))
            if chunk.get("text"):
                out.append(self._ev("TEXT_MESSAGE_CONTENT", messageId=self._text, delta=chunk["text"]))
        elif kind == "reasoning-delta":
            self._close_text(out)
            if self._reasoning is None:
                self._reasoning = f"reasoning-{seq}"
                out.append(self._ev("REASONING_START", messageId=self._reasoning))
                out.append(self._ev("REASONING_MESSAGE_START", messageId=self._reasoning, role="reasoning"))
            if chunk.get("text"):
                out.append(self._ev("REASONING_MESSAGE_CONTENT", messageId=self._reasoning, delta=chunk["text"]))
        elif kind in ("tool-call", "finish"):
            # a tool call is announced at its tool/call, and what the model says after it is a new
            # message; a finish ends the attempt (a retried request streams a message of its own)
            self._close_open(out)

    def _assistant_message(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._close_open(out)
        message = message_dict(data.get("message") or {})
        self._parent = message.get("id")
        blocks = message.get("content") or []
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool-call":
                self._calls[str(block.get("id"))] = (block.get("name", ""), block.get("arguments", ""))
        if not self._streamed:  # a whole reply: its text and reasoning at once
            reasoning = "\n".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "reasoning")
            if reasoning:
                self._reasoning_message(out, f"reasoning-{seq}", reasoning)
            text = text_of(blocks)
            if text:
                self._text_message(out, message["id"], "assistant", text)
        self._streamed = False

    def _announce(self, out: list[JsonDict], call_id: str, name: str, arguments: str) -> None:
        self._announced.add(call_id)
        start = self._ev("TOOL_CALL_START", toolCallId=call_id, toolCallName=name)
        if self._parent is not None:
            start["parentMessageId"] = self._parent
        out.append(start)
        if arguments:
            out.append(self._ev("TOOL_CALL_ARGS", toolCallId=call_id, delta=arguments))
        out.append(self._ev("TOOL_CALL_END", toolCallId=call_id))

    def _tool_call(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._close_open(out)
        arguments = data.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        self._announce(out, data["callId"], data.get("name", ""), arguments)

    def _tool_result(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._close_open(out)
        message = message_dict(data.get("message") or {})
        block = next((b for b in message.get("content") or [] if isinstance(b, dict) and b.get("type") == "tool-result"), {})
        call_id = block.get("toolCallId") or (message.get("source") or {}).get("callId") or ""
        if call_id not in self._announced:  # a synthesised result (closers, aborted before dispatch)
            name, arguments = self._calls.get(call_id, ("", ""))
            self._announce(out, call_id, name, arguments)
        result = self._ev("TOOL_CALL_RESULT", messageId=message.get("id", f"result-{seq}"), toolCallId=call_id,
                          content=text_of(block.get("content")), role="tool")
        if block.get("isError") or data.get("error"):
            result["metadata"] = {"kerman": {"isError": True, **({"error": data["error"]} if data.get("error") else {})}}
        out.append(result)

    def _turn_end(self, seq: int, data: Any, out: list[JsonDict]) -> None:
        self._close_open(out)
        reason = data.get("reason") or {}
        kind = reason.get("kind")
        run = self._run or f"turn-{data.get('turn')}"
        self._run = None
        self._step = None
        for row in self.queue.take_unread():  # claimed, never read: shown, never hidden
            out.append(self._ev("CUSTOM", name="kerman.unread", value={
                "messageId": row["id"], "text": row["text"], "placement": row["placement"], "turn": data.get("turn"),
                "reason": public_reason(reason)}))
        if kind == "error":
            error = reason.get("error") or {}
            failure = self._ev("RUN_ERROR", message=str(error.get("message") or "the turn failed"))
            if error.get("code"):
                failure["code"] = str(error["code"])
            out.append(failure)
        elif kind == "interrupted":
            out.append(self._ev("RUN_ERROR", message="the turn was interrupted: the process running it stopped",
                                code="INTERRUPTED"))
        else:
            outcome = {"type": "cancelled"} if kind == "aborted" else {"type": "success"}
            out.append(self._ev("RUN_FINISHED", threadId=self.thread_id, runId=run, outcome=outcome,
                                result={"reason": public_reason(reason)}))


_HANDLERS = {
    "agent/inbox/spliced": AgUiProjection._spliced,
    "turn/start": AgUiProjection._turn_start,
    "step/start": AgUiProjection._step_start,
    "step/end": AgUiProjection._step_end,
    "user/message": AgUiProjection._user_message,
    "assistant/chunk": AgUiProjection._chunk,
    "assistant/message": AgUiProjection._assistant_message,
    "tool/call": AgUiProjection._tool_call,
    "tool/result": AgUiProjection._tool_result,
    "turn/end": AgUiProjection._turn_end,
}
