"""The semantic fold both UI projections share: what a chat UI sees in a session log.

``UiFold.feed(event)`` reads one log event through its typed view (``kerman.events``) and
returns the parts a UI shows for it: a turn and its steps opening and closing, text and
reasoning parts opening, growing and closing (streamed or whole), user messages entering (as a
prompt, steering or context), tool calls announced and answered, the queue changing, and the
input a turn claimed and never read. The AG-UI and Vercel projections only map these parts to
their wire events, so both protocols show one reading of the log.

The rules that are the fold's, not a protocol's:

* a text part and a reasoning part are never open together: a delta of one closes the other;
* a streamed tool call, a finish chunk, the assembled message, a tool call or result, a step's
  end and a turn's end close whatever part is open (a retried request streams a new part);
* a reply that was not streamed shows its reasoning, then its text, whole;
* a tool result whose call was never announced (a closer's, or one aborted before dispatch)
  announces the call first, with the name and arguments its assistant message gave.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

from .. import events
from .._core import Event
from ._base import EventLike, JsonDict, QueueMirror

__all__ = ["UiFold", "Part"]


class QueueChanged(NamedTuple):
    """An inbox splice: ``removed`` rows at ``start`` of ``target`` replaced by ``inserted``;
    ``requeued``: the inserted ids that were claimed and never read before (sent again)."""

    target: str
    start: int
    removed: List[JsonDict]
    inserted: List[JsonDict]
    requeued: List[str]


class TurnStarted(NamedTuple):
    turn: int


class StepStarted(NamedTuple):
    step: int


class StepFinished(NamedTuple):
    step: int


class UserEntered(NamedTuple):
    """A user message entered a step; ``kind`` is ``"prompt"``, ``"steering"`` or ``"context"``."""

    message: JsonDict
    kind: str
    text: str


class PartStarted(NamedTuple):
    """A streamed text or reasoning part opened; ``seq`` (its first chunk's) names it."""

    kind: str  # "text" | "reasoning"
    seq: int


class PartDelta(NamedTuple):
    kind: str
    seq: int
    text: str


class PartEnded(NamedTuple):
    kind: str
    seq: int


class WholeReasoning(NamedTuple):
    """The reasoning of a reply that was not streamed, at once."""

    seq: int
    text: str


class WholeText(NamedTuple):
    """The text of a reply that was not streamed, at once; ``message_id`` is the message's."""

    seq: int
    message_id: str
    text: str


class ToolCallAnnounced(NamedTuple):
    """A tool call; ``parent`` is the assistant message that asked for it (``None``: none seen)."""

    call_id: str
    name: str
    arguments: Any
    parent: Optional[str]


class ToolAnswered(NamedTuple):
    seq: int
    call_id: str
    message_id: str
    text: str
    is_error: bool
    error: Optional[JsonDict]


class Unread(NamedTuple):
    """Input the turn claimed and no step read (cancelled before the decision, rejected)."""

    row: JsonDict
    turn: Any  # as the turn's end logged it
    reason: Any  # the end's reason, as logged


class TurnEnded(NamedTuple):
    """``turn`` is the turn that was open (else the end's own); ``ending`` the typed reason."""

    turn: Any
    ending: events.Ending


Part = Union[QueueChanged, TurnStarted, StepStarted, StepFinished, UserEntered, PartStarted, PartDelta, PartEnded,
             WholeReasoning, WholeText, ToolCallAnnounced, ToolAnswered, Unread, TurnEnded]


class UiFold:
    """The state a UI derives from the log prefix fed so far, and nothing else."""

    def __init__(self) -> None:
        self.queue = QueueMirror()
        self.turn: Optional[int] = None
        self.step: Optional[int] = None
        self._text: Optional[int] = None  # the open text part (its first chunk's seq)
        self._reasoning: Optional[int] = None
        self._streamed = False  # chunks since the last assistant/message (or step start)
        self._parent: Optional[str] = None  # the last assistant message, for tool calls
        self._calls: Dict[str, Tuple[str, Any]] = {}  # call id -> (name, arguments) of this turn's tool-call blocks
        self._announced: set[str] = set()

    def feed(self, event: EventLike) -> List[Part]:
        """The parts ``event`` gives (a type no UI shows gives none, and no view is built)."""
        kind = event.type if event.__class__ is Event else events.view(event).type
        entry = _HANDLERS.get(kind)
        if entry is None:
            return []
        out: List[Part] = []
        entry[1](self, entry[0](event), out)
        return out

    def _close_text(self, out: List[Part]) -> None:
        if self._text is not None:
            out.append(PartEnded("text", self._text))
            self._text = None

    def _close_reasoning(self, out: List[Part]) -> None:
        if self._reasoning is not None:
            out.append(PartEnded("reasoning", self._reasoning))
            self._reasoning = None

    def _close_open(self, out: List[Part]) -> None:
        self._close_text(out)
        self._close_reasoning(out)

    def _spliced(self, view: events.InboxSpliced, out: List[Part]) -> None:
        target, start, removed, inserted = self.queue.apply(view)
        out.append(QueueChanged(target, start, removed, inserted, self.queue.requeued(inserted)))

    def _turn_start(self, view: events.TurnStart, out: List[Part]) -> None:
        self._close_open(out)
        self.turn = view.turn
        self._calls.clear()
        self._announced.clear()
        out.append(TurnStarted(view.turn))

    def _step_start(self, view: events.StepStart, out: List[Part]) -> None:
        self.queue.step_started()
        self.step = view.step
        self._streamed = False
        out.append(StepStarted(view.step))

    def _step_end(self, view: events.StepEnd, out: List[Part]) -> None:
        self._close_open(out)
        out.append(StepFinished(view.step))

    def _user_message(self, view: events.UserMessageEvent, out: List[Part]) -> None:
        message = view.message
        kind = self.queue.entered(message.id, self.step)
        out.append(UserEntered(message.raw, kind, message.text))

    def _chunk(self, view: events.AssistantChunk, out: List[Part]) -> None:
        self._streamed = True
        chunk = view.chunk
        if isinstance(chunk, events.TextDelta):
            self._close_reasoning(out)
            if self._text is None:
                self._text = view.seq
                out.append(PartStarted("text", view.seq))
            if chunk.text:
                out.append(PartDelta("text", self._text, chunk.text))
        elif isinstance(chunk, events.ReasoningDelta):
            self._close_text(out)
            if self._reasoning is None:
                self._reasoning = view.seq
                out.append(PartStarted("reasoning", view.seq))
            if chunk.text:
                out.append(PartDelta("reasoning", self._reasoning, chunk.text))
        elif isinstance(chunk, (events.ToolCallChunk, events.FinishChunk)):
            # a tool call is announced at its tool/call, and what the model says after it is a new
            # part; a finish ends the attempt (a retried request streams a part of its own)
            self._close_open(out)

    def _assistant_message(self, view: events.AssistantMessageEvent, out: List[Part]) -> None:
        self._close_open(out)
        message = view.message
        self._parent = message.id or None
        for call in message.tool_calls:
            self._calls[call.id] = (call.name, call.arguments)
        if not self._streamed:  # a whole reply: its reasoning and text at once
            if message.reasoning:
                out.append(WholeReasoning(view.seq, message.reasoning))
            if message.text:
                out.append(WholeText(view.seq, message.id, message.text))
        self._streamed = False

    def _announce(self, out: List[Part], call_id: str, name: str, arguments: Any) -> None:
        self._announced.add(call_id)
        out.append(ToolCallAnnounced(call_id, name, arguments, self._parent))

    def _tool_call(self, view: events.ToolCall, out: List[Part]) -> None:
        self._close_open(out)
        self._announce(out, view.call_id, view.name, view.arguments)

    def _tool_result(self, view: events.ToolResultEvent, out: List[Part]) -> None:
        self._close_open(out)
        call_id = view.call_id
        if call_id not in self._announced:  # a synthesised result (closers, aborted before dispatch)
            name, arguments = self._calls.get(call_id, ("", ""))
            self._announce(out, call_id, name, arguments)
        error = view.error
        out.append(ToolAnswered(view.seq, call_id, view.message.id or f"result-{view.seq}", view.text, view.is_error,
                                error.raw if error is not None else None))

    def _turn_end(self, view: events.TurnEnd, out: List[Part]) -> None:
        self._close_open(out)
        turn = self.turn if self.turn is not None else view.turn
        self.turn = None
        self.step = None
        ending = view.reason
        for row in self.queue.take_unread():  # claimed, never read: shown, never hidden
            out.append(Unread(row, view.turn, ending.raw))
        out.append(TurnEnded(turn, ending))


# type -> (view class, handler): the fold reads these types and no others.
_HANDLERS: Dict[str, Tuple[Any, Any]] = {cls.TYPE: (cls, handler) for cls, handler in (
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
)}
