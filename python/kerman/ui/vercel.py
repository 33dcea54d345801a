"""The Vercel AI SDK projection: a session log as UI message stream parts (protocol v1).

One UI message per turn (``start`` at ``turn/start``; ``finish``, ``error`` + ``finish`` or
``abort`` at ``turn/end``), ``start-step``/``finish-step`` per loop step, text and reasoning
parts as they were streamed, ``tool-input-available`` and ``tool-output-available`` /
``tool-output-error`` for tool calls, and data parts: ``data-queue`` (the pending inbox, a
transient part replaced on every splice), ``data-prompt``, ``data-steering`` and
``data-context`` (each user message as it enters a step). A decision request shows its call
(``tool-input-available``), a ``tool-approval-request`` (approvalId = the decision id; AI SDK 6)
for an approval, and a ``data-decision`` part (id = the decision id) that its resolution
replaces; a denied or expired call ends as ``tool-output-denied``. A turn's validated
structured output is a ``data-output`` part; a running tool call's progress a transient
``data-tool-progress`` part (id ``progress-<callId>``, each update replacing the last); a continuation (a turn answering the input of one
a crash interrupted) a ``data-continues`` part after its ``start``. An event of a type Kerman does not write (a
plugin's) is a ``data-<name>`` part, named and valued by the ``custom`` mapping (by default its
type and data; ``_custom.py``). What to show is the shared
fold's (``_fold.py``); this module is its sink and only maps the parts. The mapping is in
docs/web.md.
"""

from __future__ import annotations

import json
from typing import Any, List, Optional

from .. import events
from . import _fold as f
from ._base import EventLike, JsonDict, Projection, budget_message, compaction_payload, payload, public_reason, request_payload
from ._custom import CustomMapping, mapped

__all__ = ["VercelProjection"]


_FINISH = {"completed": "stop", "max-tokens": "length", "blocked": "other"}
# a streamed part's start, delta and end types, by kind
_START = {"text": "text-start", "reasoning": "reasoning-start"}
_DELTA = {"text": "text-delta", "reasoning": "reasoning-delta"}
_END = {"text": "text-end", "reasoning": "reasoning-end"}


class VercelProjection(Projection, f.Sink):
    """Feeds on log events one at a time; ``feed(event)`` returns the stream parts (dicts in
    their wire form) that the event gives. ``custom`` maps the events of types Kerman does not
    write (``kerman.ui.Custom``, or ``None`` to drop one); by default each is a
    ``data-<type>`` part, its data the part's."""

    def __init__(self, *, custom: Optional[CustomMapping] = None) -> None:
        self.custom_mapping = custom
        self.fold = f.UiFold(self)
        self.queue = self.fold.queue
        self._out: List[JsonDict] = []
        self._part = (-1, "")  # the open part's seq and id: a delta per streamed chunk reuses the id
        self._shown: dict[str, Any] = {}  # call id -> arguments shown with its decision request (this turn)
        self._denied: set[str] = set()  # calls shown as tool-output-denied (this turn)
        self._requests: dict[str, JsonDict] = {}  # decision id -> its request, until resolved

    def feed(self, event: EventLike) -> List[JsonDict]:
        out = self._out = []
        self.fold.feed(event)
        return out

    def queue_changed(self, target: str, start: int, removed: List[JsonDict], inserted: List[JsonDict], requeued: List[str]) -> None:
        self._out.append({"type": "data-queue", "id": "queue", "data": self.queue.state(), "transient": True})

    def turn_started(self, turn: int) -> None:
        self._shown.clear()
        self._denied.clear()
        self._out.append({"type": "start", "messageId": f"turn-{turn}"})

    def turn_continues(self, turn: int, continues: int) -> None:
        self._out.append({"type": "data-continues", "id": f"continues-{turn}", "data": {"turn": turn, "continues": continues}})

    def step_started(self, step: int) -> None:
        self._out.append({"type": "start-step"})

    def step_finished(self, step: int) -> None:
        self._out.append({"type": "finish-step"})

    def user_entered(self, message: JsonDict, kind: str, text: str) -> None:
        message_id = message["id"]
        self._out.append({"type": f"data-{kind}", "id": message_id, "data": {"id": message_id, "text": text, "message": message}})

    def _part_id(self, kind: str, seq: int) -> str:
        part = self._part
        if part[0] != seq:
            part = self._part = (seq, f"{kind}-{seq}")
        return part[1]

    def part_started(self, kind: str, seq: int) -> None:
        self._out.append({"type": _START[kind], "id": self._part_id(kind, seq)})

    def part_delta(self, kind: str, seq: int, text: str) -> None:
        part = self._part
        self._out.append({"type": _DELTA[kind], "id": part[1] if part[0] == seq else self._part_id(kind, seq), "delta": text})

    def part_ended(self, kind: str, seq: int) -> None:
        self._out.append({"type": _END[kind], "id": self._part_id(kind, seq)})

    def whole_reasoning(self, seq: int, text: str) -> None:
        rid = f"reasoning-{seq}"
        self._out += [
            {"type": "reasoning-start", "id": rid},
            {"type": "reasoning-delta", "id": rid, "delta": text},
            {"type": "reasoning-end", "id": rid},
        ]

    def whole_text(self, seq: int, message_id: str, text: str) -> None:
        tid = f"text-{seq}"
        self._out += [{"type": "text-start", "id": tid}, {"type": "text-delta", "id": tid, "delta": text}, {"type": "text-end", "id": tid}]

    def tool_called(self, call_id: str, name: str, arguments: Any, parent: Optional[str]) -> None:
        if call_id in self._shown and self._shown[call_id] == arguments:
            return  # shown with its decision request, and it runs as it was shown
        self._input(call_id, name, arguments)

    def _input(self, call_id: str, name: str, arguments: Any) -> None:
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments else {}
            except ValueError as error:
                self._out.append(
                    {
                        "type": "tool-input-error",
                        "toolCallId": call_id,
                        "toolName": name,
                        "input": arguments,
                        "errorText": f"the arguments are not JSON: {error}",
                    }
                )
                return
        else:
            parsed = arguments
        self._out.append({"type": "tool-input-available", "toolCallId": call_id, "toolName": name, "input": parsed})

    def tool_answered(self, seq: int, call_id: str, message_id: str, text: str, is_error: bool, error: Optional[JsonDict]) -> None:
        if call_id in self._denied:
            return  # its denial is its output
        if is_error:
            self._out.append({"type": "tool-output-error", "toolCallId": call_id, "errorText": text or "the tool failed"})
        else:
            self._out.append({"type": "tool-output-available", "toolCallId": call_id, "output": text})

    def decision_requested(self, request: events.DecisionRequested) -> None:
        call_id = request.call_id
        # A started call was shown by its tool/call; a budget request is about no call.
        if request.call_seq is None and request.kind != "budget" and call_id not in self._shown:
            self._shown[call_id] = request.arguments
            self._input(call_id, request.name, request.arguments)
        if request.kind == "approval":
            self._out.append({"type": "tool-approval-request", "approvalId": request.decision_id, "toolCallId": call_id})
        raw = self._requests[request.decision_id] = request_payload(request)
        self._out.append({"type": "data-decision", "id": request.decision_id, "data": {**raw, "status": "pending"}})

    def output_validated(self, output: events.OutputValidated) -> None:
        self._out.append({"type": "data-output", "data": payload(output)})

    def tool_progress(self, progress: events.ToolProgress) -> None:
        # transient, one id per call: the client shows the latest update and keeps none of them
        self._out.append({"type": "data-tool-progress", "id": f"progress-{progress.call_id}", "data": payload(progress), "transient": True})

    def compacted(self, compaction: events.ContextCompacted) -> None:
        self._out.append({"type": "data-compaction", "id": f"compaction-{compaction.seq}", "data": compaction_payload(compaction)})

    def decision_resolved(self, resolution: events.DecisionResolved) -> None:
        outcome = resolution.outcome
        request = self._requests.pop(resolution.decision_id, {})
        self._out.append(
            {
                "type": "data-decision",
                "id": resolution.decision_id,
                "data": {**request, "status": outcome, "resolution": payload(resolution)},
            }
        )
        if outcome in ("denied", "expired") and resolution.call_id in self._shown:
            self._denied.add(resolution.call_id)
            self._out.append({"type": "tool-output-denied", "toolCallId": resolution.call_id})

    def custom(self, view: events.OtherEvent) -> None:
        shown = mapped(self.custom_mapping, view)
        if shown is None:
            return
        part: JsonDict = {"type": f"data-{shown.name}"}
        if shown.id is not None:
            part["id"] = shown.id
        part["data"] = shown.value
        if shown.transient:
            part["transient"] = True
        self._out.append(part)

    def unread(self, row: JsonDict, turn: Any, reason: Any) -> None:
        """Not a part of this protocol: the queue parts already show the input is gone."""

    def turn_rolled_back(self, turn: Any) -> None:
        self._out.append({"type": "data-rolled-back", "data": {"turn": turn}})

    def turn_ended(self, turn: Any, ending: events.Ending) -> None:
        kind = ending.kind
        metadata = {"turn": turn, "reason": public_reason(ending.raw)}
        if kind == "aborted":
            cause = ending.cause
            text = cause.kind if cause is not None else None
            self._out.append({"type": "abort", **({"reason": text} if text else {})})
        elif kind in ("error", "interrupted", "budget"):
            error = ending.error
            message = (error.message if error else "") if kind == "error" else "the turn was interrupted: the process running it stopped"
            if kind == "budget":
                message = budget_message(ending)
            self._out.append({"type": "error", "errorText": message or "the turn failed"})
            self._out.append({"type": "finish", "finishReason": "error", "messageMetadata": metadata})
        else:
            self._out.append({"type": "finish", "finishReason": _FINISH.get(str(kind), "other"), "messageMetadata": metadata})
