"""The AG-UI projection: a session log as AG-UI events (https://docs.ag-ui.com).

One run per turn (``RUN_STARTED`` at ``turn/start``, ``RUN_FINISHED`` or ``RUN_ERROR`` at
``turn/end``), one AG-UI step per loop step, streamed text and reasoning as they were chunked,
tool calls with their results, user messages as ``user`` text messages, and the queue as shared
state (``STATE_SNAPSHOT`` once, then a JSON Patch ``STATE_DELTA`` per inbox splice). A turn that
waits for decisions ends its run with the interrupt outcome (one ``Interrupt`` per pending
request) once the step's calls that need no decision have their results (they run while it
waits; a request decided before that is no interrupt); once every request of the step is resolved, the turn goes on in a new run whose
``input.resume`` answers them (AG-UI 1.0, "Interrupts and Resume"). A turn's validated
structured output is a ``CUSTOM`` event named ``kerman.output/validated``; a running tool
call's progress one named ``kerman.tool/progress``; a continuation (a
turn answering the input of one a crash interrupted) a ``CUSTOM`` event named
``kerman.continues`` after its ``RUN_STARTED``. An event of a type
Kerman does not write (a plugin's) is a ``CUSTOM`` event, named and valued by the ``custom``
mapping (by default its type and data; ``_custom.py``). What to show
is the shared fold's (``_fold.py``); this module is its sink and only maps the parts. The mapping is written
down in docs/web.md.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Set

from .. import events
from .._core import Event
from . import _fold as f
from ._base import EventLike, JsonDict, Projection, budget_message, compaction_payload, payload, public_reason, request_payload
from ._custom import CustomMapping, mapped

__all__ = ["AgUiProjection"]

_LIST_KEYS = {"next-turn": "nextTurn", "next-step": "nextStep"}


class AgUiProjection(Projection, f.Sink):
    """Feeds on log events one at a time; ``feed(event)`` returns the AG-UI events (dicts in
    their wire form, camelCase) that the event gives. The state it keeps is derived from the
    events fed so far and nothing else. ``custom`` maps the events of types Kerman does not
    write (``kerman.ui.Custom``, or ``None`` to drop one); by default each is a ``CUSTOM``
    event named by its type, its data the value."""

    def __init__(self, thread_id: str = "session", *, custom: Optional[CustomMapping] = None) -> None:
        self.thread_id = thread_id
        self.custom_mapping = custom
        self.fold = f.UiFold(self)
        self.queue = self.fold.queue
        self._snapshot_sent = False
        self._time = 0
        self._out: List[JsonDict] = []
        self._part = (-1, "")  # the open text part's seq and message id: each delta reuses the id
        self._run_id = ""
        self._runs = 0  # runs of the open turn after its first (each resume is one)
        self._asked: Dict[str, JsonDict] = {}  # decision id -> its Interrupt, the step not known to wait yet
        self._waiting: Dict[str, JsonDict] = {}  # decision id -> its Interrupt, the run ended on them
        self._answers: List[JsonDict] = []  # resume entries of the resolved ones
        # The step's calls that need no decision and run while it waits: its run ends with the
        # interrupt once they have their results (then nothing of the step runs any more).
        self._running: Set[str] = set()
        self._shown: Dict[str, Any] = {}  # call id -> arguments announced with its request (this turn)

    def _ev(self, type: str, **fields: Any) -> JsonDict:
        # The per-chunk parts below (step bounds, streamed deltas) write their dict whole
        # instead: a keyword call and a merge cost more than the rest of a chunk's fold.
        return {"type": type, "timestamp": self._time, **fields}

    def feed(self, event: EventLike) -> List[JsonDict]:
        out = self._out = []
        self._time = event.time if event.__class__ is Event else int(event.get("time", 0))  # type: ignore[union-attr]
        self.fold.feed(event)
        return out

    def _text_message(self, message_id: str, role: str, text: str) -> None:
        self._out.append(self._ev("TEXT_MESSAGE_START", messageId=message_id, role=role))
        if text:
            self._out.append(self._ev("TEXT_MESSAGE_CONTENT", messageId=message_id, delta=text))
        self._out.append(self._ev("TEXT_MESSAGE_END", messageId=message_id))

    def queue_changed(self, target: str, start: int, removed: List[JsonDict], inserted: List[JsonDict], requeued: List[str]) -> None:
        for message_id in requeued:
            self._out.append(self._ev("CUSTOM", name="kerman.requeued", value={"messageId": message_id}))
        if not self._snapshot_sent:
            self._snapshot_sent = True
            self._out.append(self._ev("STATE_SNAPSHOT", snapshot={"queue": self.queue.state()}))
            return
        path = f"/queue/{_LIST_KEYS[target]}"
        ops: List[JsonDict] = [{"op": "remove", "path": f"{path}/{start}"} for _ in removed]
        ops += [{"op": "add", "path": f"{path}/{start + i}", "value": row} for i, row in enumerate(inserted)]
        self._out.append(self._ev("STATE_DELTA", delta=ops))

    def turn_started(self, turn: int) -> None:
        self._run_id = f"turn-{turn}"
        self._runs = 0
        self._shown.clear()
        self._out.append(self._ev("RUN_STARTED", threadId=self.thread_id, runId=self._run_id))

    def turn_continues(self, turn: int, continues: int) -> None:
        self._out.append(self._ev("CUSTOM", name="kerman.continues", value={"turn": turn, "continues": continues}))

    def step_started(self, step: int) -> None:
        self._out.append({"type": "STEP_STARTED", "timestamp": self._time, "stepName": f"step-{step}"})

    def step_finished(self, step: int) -> None:
        self._out.append({"type": "STEP_FINISHED", "timestamp": self._time, "stepName": f"step-{step}"})

    def user_entered(self, message: JsonDict, kind: str, text: str) -> None:
        message_id = message["id"]
        if kind != "prompt":
            self._out.append(self._ev("CUSTOM", name=f"kerman.{kind}", value={"messageId": message_id, "message": message}))
        self._text_message(message_id, "user", text)

    def part_started(self, kind: str, seq: int) -> None:
        time = self._time
        if kind == "text":
            self._out.append({"type": "TEXT_MESSAGE_START", "timestamp": time, "messageId": f"msg-{seq}", "role": "assistant"})
        else:
            message_id = f"reasoning-{seq}"
            self._out.append({"type": "REASONING_START", "timestamp": time, "messageId": message_id})
            self._out.append({"type": "REASONING_MESSAGE_START", "timestamp": time, "messageId": message_id, "role": "reasoning"})

    def part_delta(self, kind: str, seq: int, text: str) -> None:
        if kind == "text":
            part = self._part
            if part[0] != seq:
                part = self._part = (seq, f"msg-{seq}")
            self._out.append({"type": "TEXT_MESSAGE_CONTENT", "timestamp": self._time, "messageId": part[1], "delta": text})
        else:
            self._out.append({"type": "REASONING_MESSAGE_CONTENT", "timestamp": self._time, "messageId": f"reasoning-{seq}", "delta": text})

    def part_ended(self, kind: str, seq: int) -> None:
        time = self._time
        if kind == "text":
            self._out.append({"type": "TEXT_MESSAGE_END", "timestamp": time, "messageId": f"msg-{seq}"})
        else:
            message_id = f"reasoning-{seq}"
            self._out.append({"type": "REASONING_MESSAGE_END", "timestamp": time, "messageId": message_id})
            self._out.append({"type": "REASONING_END", "timestamp": time, "messageId": message_id})

    def whole_reasoning(self, seq: int, text: str) -> None:
        message_id = f"reasoning-{seq}"
        self._out.append(self._ev("REASONING_START", messageId=message_id))
        self._out.append(self._ev("REASONING_MESSAGE_START", messageId=message_id, role="reasoning"))
        self._out.append(self._ev("REASONING_MESSAGE_CONTENT", messageId=message_id, delta=text))
        self._out.append(self._ev("REASONING_MESSAGE_END", messageId=message_id))
        self._out.append(self._ev("REASONING_END", messageId=message_id))

    def whole_text(self, seq: int, message_id: str, text: str) -> None:
        self._text_message(message_id, "assistant", text)

    def tool_called(self, call_id: str, name: str, arguments: Any, parent: Optional[str]) -> None:
        if call_id in self._shown:
            return  # announced with its decision request (edited arguments: in its resolution)
        self._announce(call_id, name, arguments, parent)

    def _announce(self, call_id: str, name: str, arguments: Any, parent: Optional[str]) -> None:
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        start = self._ev("TOOL_CALL_START", toolCallId=call_id, toolCallName=name)
        if parent is not None:
            start["parentMessageId"] = parent
        self._out.append(start)
        if arguments:
            self._out.append(self._ev("TOOL_CALL_ARGS", toolCallId=call_id, delta=arguments))
        self._out.append(self._ev("TOOL_CALL_END", toolCallId=call_id))

    def tool_answered(self, seq: int, call_id: str, message_id: str, text: str, is_error: bool, error: Optional[JsonDict]) -> None:
        result = self._ev("TOOL_CALL_RESULT", messageId=message_id, toolCallId=call_id, content=text, role="tool")
        if is_error:
            result["metadata"] = {"kerman": {"isError": True, **({"error": error} if error else {})}}
        self._out.append(result)
        if call_id in self._running:
            self._running.discard(call_id)
            if not self._running and self._asked:
                self._interrupt()

    def unread(self, row: JsonDict, turn: Any, reason: Any) -> None:
        self._out.append(
            self._ev(
                "CUSTOM",
                name="kerman.unread",
                value={
                    "messageId": row["id"],
                    "text": row["text"],
                    "placement": row["placement"],
                    "turn": turn,
                    "reason": public_reason(reason),
                },
            )
        )

    def turn_rolled_back(self, turn: Any) -> None:
        self._out.append(self._ev("CUSTOM", name="kerman.turn/rolled-back", value={"turn": turn}))

    def turn_ended(self, turn: Any, ending: events.Ending) -> None:
        kind = ending.kind
        if kind == "error":
            error = ending.error
            failure = self._ev("RUN_ERROR", message=(error.message if error else "") or "the turn failed")
            if error is not None and error.code:
                failure["code"] = error.code
            self._out.append(failure)
        elif kind == "interrupted":
            self._out.append(self._ev("RUN_ERROR", message="the turn was interrupted: the process running it stopped", code="INTERRUPTED"))
        elif kind == "budget":
            self._out.append(self._ev("RUN_ERROR", message=budget_message(ending), code="BUDGET"))
        else:
            outcome = {"type": "cancelled"} if kind == "aborted" else {"type": "success"}
            self._out.append(
                self._ev(
                    "RUN_FINISHED",
                    threadId=self.thread_id,
                    runId=self._run_id or f"turn-{turn}",
                    outcome=outcome,
                    result={"reason": public_reason(ending.raw)},
                )
            )
        self._run_id = ""
        self._running = set()
        self._asked = {}

    def custom(self, view: events.OtherEvent) -> None:
        shown = mapped(self.custom_mapping, view)
        if shown is not None:
            self._out.append(self._ev("CUSTOM", name=shown.name, value=shown.value))

    def decision_requested(self, request: events.DecisionRequested) -> None:
        raw = request_payload(request)
        # About a call that started (announced by its tool/call), or about no call (a budget).
        started = request.call_seq is not None or request.kind == "budget"
        if not started and request.call_id not in self._shown:  # the call the interrupt names is announced first
            self._shown[request.call_id] = request.arguments
            self._announce(request.call_id, request.name, request.arguments, self.fold._parent)
        self._out.append(self._ev("CUSTOM", name="kerman.decision/requested", value=raw))
        interrupt: JsonDict = {
            "id": request.decision_id,
            "reason": {"approval": "tool_approval", "in-doubt": "tool_in_doubt", "input": "tool_input", "budget": "budget"}.get(
                request.kind, "tool_answer"
            ),
            "toolCallId": request.call_id,
        }
        if request.note is not None:
            interrupt["message"] = request.note
        if isinstance(request.schema, dict):
            interrupt["responseSchema"] = request.schema
        if request.expires_at is not None:
            interrupt["expiresAt"] = _iso(request.expires_at)
        interrupt["metadata"] = {
            "kerman": {k: raw[k] for k in ("name", "arguments", "digest", "kind", "turn", "step", "index") if k in raw}
        }
        self._asked[request.decision_id] = interrupt
        if request.last:  # the final request of the round: the step waits once its other calls ran
            self._running = {str(g.get("callId")) for g in request.gated if isinstance(g, dict)}
            if not self._running:
                self._interrupt()

    def _interrupt(self) -> None:
        """The step waits: its run ends with the interrupt outcome, listing every pending request."""
        self._waiting.update(self._asked)
        self._asked = {}
        if self._run_id:
            self._out.append(
                self._ev(
                    "RUN_FINISHED",
                    threadId=self.thread_id,
                    runId=self._run_id,
                    outcome={"type": "interrupt", "interrupts": list(self._waiting.values())},
                )
            )
            self._run_id = ""

    def output_validated(self, output: events.OutputValidated) -> None:
        self._out.append(self._ev("CUSTOM", name="kerman.output/validated", value=payload(output)))

    def tool_progress(self, progress: events.ToolProgress) -> None:
        self._out.append(self._ev("CUSTOM", name="kerman.tool/progress", value=payload(progress)))

    def compacted(self, compaction: events.ContextCompacted) -> None:
        self._out.append(self._ev("CUSTOM", name="kerman.context/compacted", value=compaction_payload(compaction)))

    def decision_resolved(self, resolution: events.DecisionResolved) -> None:
        raw = payload(resolution)
        self._out.append(self._ev("CUSTOM", name="kerman.decision/resolved", value=raw))
        if self._asked.pop(resolution.decision_id, None) is not None:
            return  # decided before its step waited (the step's other calls were still running)
        if self._waiting.pop(resolution.decision_id, None) is None:
            return
        outcome = resolution.outcome
        entry: JsonDict = {"interruptId": resolution.decision_id}
        if outcome in ("expired", "cancelled"):
            entry["status"] = "cancelled"
        else:
            entry["status"] = "resolved"
            entry["payload"] = {k: raw[k] for k in ("outcome", "arguments", "reason", "value") if k in raw}
        envelope = {k: raw[k] for k in ("outcome", "by", "key", "digest") if k in raw}
        entry["metadata"] = {"kerman": envelope}
        self._answers.append(entry)
        if not self._waiting and self.fold.turn is not None:  # every request answered: the turn goes on
            self._runs += 1
            self._run_id = f"turn-{self.fold.turn}.{self._runs}"
            resume, self._answers = self._answers, []
            self._out.append(
                self._ev(
                    "RUN_STARTED",
                    threadId=self.thread_id,
                    runId=self._run_id,
                    input={"threadId": self.thread_id, "runId": self._run_id, "messages": [], "resume": resume},
                )
            )


def _iso(millis: int) -> str:
    """Epoch milliseconds as ISO 8601 in UTC (what AG-UI's ``expiresAt`` expects)."""
    moment = datetime.fromtimestamp(millis / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis % 1000:03d}Z"
