"""The semantic fold both UI projections share: what a chat UI sees in a session log.

``UiFold.feed(event)`` reads one log event through its typed view (``kerman.events``) and
tells its ``Sink`` what a UI shows for it, one method call per part: a turn and its steps opening and closing, text and
reasoning parts opening, growing and closing (streamed or whole), user messages entering (as a
prompt, steering or context), tool calls announced and answered, the queue changing, and the
input a turn claimed and never read. The AG-UI and Vercel projections are sinks that only map
these parts to their wire events, so both protocols show one reading of the log. (Calls rather
than part objects: a UI folds every event, and a call costs less than an object and a lookup.)

The rules that are the fold's, not a protocol's:

* a text part and a reasoning part are never open together: a delta of one closes the other;
* a streamed tool call, a finish chunk, the assembled message, a tool call or result, a step's
  end and a turn's end close whatever part is open (a retried request streams a new part);
* a reply that was not streamed shows its reasoning, then its text, whole;
* a tool result whose call was never announced (a closer's, or one aborted before dispatch)
  announces the call first, with the name and arguments its assistant message gave;
* a continuation (a turn that answers the input of one a crash interrupted) is told right
  after its start, with the turn it continues;
* a turn that ends rolled back (``on_busy="rollback"``) is told so before it ends;
* a decision request and its resolution are told as they come (docs/decisions.md); the
  request marked ``last`` is the final one before the step waits;
* a tool call's progress (``tool/progress``) is told as it comes, and closes nothing: an open
  text part stays open around it (a call runs while the model's text may still stream);
* an event of a type Kerman does not write (a plugin's, an application's) is told as it comes,
  and changes nothing else: an open text part stays open around it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .. import events
from .._core import Event
from ..events import FinishChunk, ReasoningDelta, TextDelta, ToolCallChunk
from ._base import EventLike, JsonDict, QueueMirror

__all__ = ["UiFold", "Sink"]


class Sink:
    """What a UI is told, one call per part. Every method does nothing here; a projection
    overrides the ones its protocol shows."""

    def queue_changed(self, target: str, start: int, removed: List[JsonDict], inserted: List[JsonDict], requeued: List[str]) -> None:
        """An inbox splice: ``removed`` rows at ``start`` of ``target`` replaced by ``inserted``;
        ``requeued``: the inserted ids that were claimed and never read before (sent again)."""

    def turn_started(self, turn: int) -> None:
        """A turn began."""

    def turn_continues(self, turn: int, continues: int) -> None:
        """Turn ``turn`` (just started) is a continuation: it answers the input of turn
        ``continues``, which a crash interrupted (docs/durability.md)."""

    def step_started(self, step: int) -> None:
        """A step began."""

    def step_finished(self, step: int) -> None:
        """A step ended (after the parts it opened closed)."""

    def user_entered(self, message: JsonDict, kind: str, text: str) -> None:
        """A user message entered a step as a ``"prompt"``, ``"steering"`` or ``"context"``."""

    def part_started(self, kind: str, seq: int) -> None:
        """A streamed ``"text"`` or ``"reasoning"`` part opened; ``seq`` (its first chunk's)
        names it until it ends."""

    def part_delta(self, kind: str, seq: int, text: str) -> None:
        """Text appended to the open part ``seq`` (never empty)."""

    def part_ended(self, kind: str, seq: int) -> None:
        """The part ``seq`` closed."""

    def whole_reasoning(self, seq: int, text: str) -> None:
        """The reasoning of a reply that was not streamed (``seq``: its message's), at once."""

    def whole_text(self, seq: int, message_id: str, text: str) -> None:
        """The text of a reply that was not streamed, at once."""

    def tool_called(self, call_id: str, name: str, arguments: Any, parent: Optional[str]) -> None:
        """A tool call; ``arguments`` as the model wrote them (normally JSON text); ``parent`` the
        assistant message that asked for it (``None``: none seen)."""

    def tool_answered(self, seq: int, call_id: str, message_id: str, text: str, is_error: bool, error: Optional[JsonDict]) -> None:
        """A tool call's result (``error``: the failure the log gives, if any)."""

    def unread(self, row: JsonDict, turn: Any, reason: Any) -> None:
        """Input the ending turn claimed and no step read (cancelled before the decision,
        rejected); ``turn`` and ``reason`` as the turn's end logged them."""

    def turn_rolled_back(self, turn: Any) -> None:
        """The ending turn was rolled back (``on_busy="rollback"``): a UI shows its messages
        as out of the conversation. Told just before its ``turn_ended``."""

    def turn_ended(self, turn: Any, ending: events.Ending) -> None:
        """A turn ended; ``turn`` is the turn that was open (else the end's own)."""

    def decision_requested(self, request: events.DecisionRequested) -> None:
        """A tool call waits for a person (docs/decisions.md); the turn waits with it."""

    def decision_resolved(self, resolution: events.DecisionResolved) -> None:
        """A pending request was resolved (approved, denied, edited, answered, expired or
        cancelled)."""

    def custom(self, view: events.OtherEvent) -> None:
        """An event of a type Kerman does not write (``kerman.events.TYPES`` lacks it)."""

    def output_validated(self, output: events.OutputValidated) -> None:
        """The turn's structured output, validated (``output.output``: its JSON value)."""

    def tool_progress(self, progress: events.ToolProgress) -> None:
        """A running tool call reported progress (``progress.call_id``; docs/mcp.md, "Progress")."""

    def compacted(self, compaction: events.ContextCompacted) -> None:
        """The history was compacted: from here on, requests see ``compaction.messages`` in
        place of the span ``first..last`` (docs/context.md, "Compaction")."""


class UiFold:
    """The state a UI derives from the log prefix fed so far, and nothing else."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.queue = QueueMirror()
        self.turn: Optional[int] = None
        self.step: Optional[int] = None
        self._text: Optional[int] = None  # the open text part (its first chunk's seq)
        self._reasoning: Optional[int] = None
        self._streamed = False  # chunks since the last assistant/message (or step start)
        self._parent: Optional[str] = None  # the last assistant message, for tool calls
        self._calls: Dict[str, Tuple[str, Any]] = {}  # call id -> (name, arguments) of this turn's tool-call blocks
        self._announced: set[str] = set()

    def feed(self, event: EventLike) -> bool:
        """Tells the sink the parts ``event`` gives; whether it is a type UIs show (for an
        ``Event`` of any other type no view is built)."""
        if event.__class__ is Event:
            entry = _HANDLERS.get(event.type)
            if entry is None:
                if event.type in events.TYPES:  # Kerman's own, not shown (log repair records)
                    return False
                self.sink.custom(events.OtherEvent(event))
                return True
            cls, handler = entry
            handler(self, cls(event))
            return True
        view = events.view(event)
        handler = _BY_CLASS.get(view.__class__)
        if handler is None:
            if view.__class__ is not events.OtherEvent:
                return False
            handler = UiFold._custom
        handler(self, view)
        return True

    def _close_text(self) -> None:
        if self._text is not None:
            self.sink.part_ended("text", self._text)
            self._text = None

    def _close_reasoning(self) -> None:
        if self._reasoning is not None:
            self.sink.part_ended("reasoning", self._reasoning)
            self._reasoning = None

    def _close_open(self) -> None:
        # called at most events, where usually nothing is open: test before calling
        if self._text is not None:
            self._close_text()
        if self._reasoning is not None:
            self._close_reasoning()

    def _spliced(self, view: events.InboxSpliced) -> None:
        target, start, removed, inserted = self.queue.apply(view)
        self.sink.queue_changed(target, start, removed, inserted, self.queue.requeued(inserted))

    def _turn_start(self, view: events.TurnStart) -> None:
        self._close_open()
        turn = self.turn = view.turn
        self._calls.clear()
        self._announced.clear()
        self.sink.turn_started(turn)
        continues = view.continues
        if continues is not None:
            self.sink.turn_continues(turn, continues)

    def _step_start(self, view: events.StepStart) -> None:
        self.queue.step_started()
        step = self.step = view.step
        self._streamed = False
        self.sink.step_started(step)

    def _step_end(self, view: events.StepEnd) -> None:
        self._close_open()
        self.sink.step_finished(view.step)

    def _user_message(self, view: events.UserMessageEvent) -> None:
        message = view.message
        kind = self.queue.entered(message.id, self.step)
        self.sink.user_entered(message.raw, kind, message.text)

    def _chunk(self, view: events.AssistantChunk) -> None:
        # the one handler every streamed token goes through: each field is read once
        self._streamed = True
        chunk = view.chunk
        if isinstance(chunk, TextDelta):
            if self._reasoning is not None:
                self._close_reasoning()
            if self._text is None:
                self._text = view.seq
                self.sink.part_started("text", self._text)
            text = chunk.text
            if text:
                self.sink.part_delta("text", self._text, text)
        elif isinstance(chunk, ReasoningDelta):
            if self._text is not None:
                self._close_text()
            if self._reasoning is None:
                self._reasoning = view.seq
                self.sink.part_started("reasoning", self._reasoning)
            text = chunk.text
            if text:
                self.sink.part_delta("reasoning", self._reasoning, text)
        elif isinstance(chunk, (ToolCallChunk, FinishChunk)):
            # a tool call is announced at its tool/call, and what the model says after it is a new
            # part; a finish ends the attempt (a retried request streams a part of its own)
            self._close_open()
            if chunk.__class__ is FinishChunk and chunk.reason not in ("stop", "max-tokens"):
                # a failed attempt gets no message: the next message is the retry's, and a whole
                # reply shows its text (the loop logs a failed finish for a request that failed
                # before its first chunk, too)
                self._streamed = False

    def _assistant_message(self, view: events.AssistantMessageEvent) -> None:
        self._close_open()
        message = view.message
        message_id = message.id
        self._parent = message_id or None
        for call in message.tool_calls:
            self._calls[call.id] = (call.name, call.arguments)
        if not self._streamed:  # a whole reply: its reasoning and text at once
            reasoning = message.reasoning
            if reasoning:
                self.sink.whole_reasoning(view.seq, reasoning)
            text = message.text
            if text:
                self.sink.whole_text(view.seq, message_id, text)
        self._streamed = False

    def _announce(self, call_id: str, name: str, arguments: Any) -> None:
        self._announced.add(call_id)
        self.sink.tool_called(call_id, name, arguments, self._parent)

    def _tool_call(self, view: events.ToolCall) -> None:
        self._close_open()
        self._announce(view.call_id, view.name, view.arguments)

    def _tool_result(self, view: events.ToolResultEvent) -> None:
        self._close_open()
        call_id = view.call_id
        if call_id not in self._announced:  # a synthesised result (closers, aborted before dispatch)
            name, arguments = self._calls.get(call_id, ("", ""))
            self._announce(call_id, name, arguments)
        error = view.error
        seq = view.seq
        self.sink.tool_answered(
            seq, call_id, view.message.id or f"result-{seq}", view.text, view.is_error, error.raw if error is not None else None
        )

    def _decision_requested(self, view: events.DecisionRequested) -> None:
        self.sink.decision_requested(view)

    def _decision_resolved(self, view: events.DecisionResolved) -> None:
        self.sink.decision_resolved(view)

    def _custom(self, view: events.OtherEvent) -> None:
        self.sink.custom(view)

    def _output_validated(self, view: events.OutputValidated) -> None:
        self.sink.output_validated(view)

    def _tool_progress(self, view: events.ToolProgress) -> None:
        self.sink.tool_progress(view)

    def _compacted(self, view: events.ContextCompacted) -> None:
        self.sink.compacted(view)

    def _turn_end(self, view: events.TurnEnd) -> None:
        self._close_open()
        turn = self.turn if self.turn is not None else view.turn
        self.turn = None
        self.step = None
        ending = view.reason
        for row in self.queue.take_unread():  # claimed, never read: shown, never hidden
            self.sink.unread(row, view.turn, ending.raw)
        if ending.rolled_back:
            self.sink.turn_rolled_back(turn)
        self.sink.turn_ended(turn, ending)


# type -> (view class, handler): the fold reads these types and no others.
_HANDLERS: Dict[str, Tuple[Any, Any]] = {
    cls.TYPE: (cls, handler)
    for cls, handler in (
        (events.InboxSpliced, UiFold._spliced),
        (events.TurnStart, UiFold._turn_start),
        (events.StepStart, UiFold._step_start),
        (events.StepEnd, UiFold._step_end),
        (events.UserMessageEvent, UiFold._user_message),
        (events.AssistantChunk, UiFold._chunk),
        (events.AssistantMessageEvent, UiFold._assistant_message),
        (events.ToolCall, UiFold._tool_call),
        (events.ToolResultEvent, UiFold._tool_result),
        (events.TurnEnd, UiFold._turn_end),
        (events.DecisionRequested, UiFold._decision_requested),
        (events.DecisionResolved, UiFold._decision_resolved),
        (events.OutputValidated, UiFold._output_validated),
        (events.ContextCompacted, UiFold._compacted),
        (events.ToolProgress, UiFold._tool_progress),
    )
}
# view class -> handler, for an event given as a dict (its view is built first)
_BY_CLASS: Dict[type, Any] = {cls: handler for cls, handler in _HANDLERS.values()}
