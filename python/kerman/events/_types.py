"""One view class per event type Kerman writes, and the generic view of every other type."""

from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Mapping, Optional, Union

from .._core import Event
from ._values import (
    _CHUNKS,
    _EMPTY,
    Chunk,
    Ending,
    Failure,
    JsonObject,
    MessageView,
    OtherChunk,
    ToolResultBlock,
    Usage,
    _dict,
    _int,
    _str,
    message,
)

__all__ = [
    "EventView",
    "TurnStart",
    "TurnEnd",
    "StepStart",
    "StepEnd",
    "UserMessageEvent",
    "RequestHeader",
    "InstructionsChanged",
    "AssistantChunk",
    "AssistantMessageEvent",
    "ToolCall",
    "ToolResultEvent",
    "InboxSpliced",
    "LogDamaged",
    "LogRepaired",
    "OtherEvent",
]

#: An event: a ``kerman.Event``, or its ``to_dict()`` form.
EventLike = Union[Event, Mapping[str, Any]]
_UNSET: Any = object()


class _Envelope:
    """An event's ``to_dict()`` form read like an ``Event`` (so a view checks the kind once)."""

    __slots__ = ("seq", "time", "type", "_raw")

    def __init__(self, event: Mapping[str, Any]) -> None:
        self.seq: int = event["seq"]
        self.time = int(event.get("time", 0))
        self.type: str = event["type"]
        self._raw = event

    @property
    def data(self) -> Any:
        return self._raw.get("data")

    @property
    def source_event_seqs(self) -> Optional[List[int]]:
        return self._raw.get("sourceEventSeqs")


class EventView:
    """The typed view of one log event. ``seq``, ``time``, ``type`` and ``data`` (the payload,
    as stored) are the event's; the subclass for each type adds its payload's fields as
    properties, read from ``data`` when asked. ``event`` is what the view was made from."""

    __slots__ = ("event", "_source", "_data")
    #: The event type this view reads (``""`` for ``OtherEvent``, which reads any type).
    TYPE: ClassVar[str] = ""

    def __init__(self, event: EventLike) -> None:
        self.event = event
        self._source: Union[Event, _Envelope] = event if event.__class__ is Event else _Envelope(event)  # type: ignore[arg-type]
        self._data: Any = _UNSET

    @property
    def seq(self) -> int:
        return self._source.seq

    @property
    def time(self) -> int:
        return self._source.time

    @property
    def type(self) -> str:
        return self._source.type

    @property
    def data(self) -> Any:
        """The payload exactly as stored (unknown fields included)."""
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        return data

    @property
    def source_event_seqs(self) -> Optional[List[int]]:
        return self._source.source_event_seqs

    def _field(self, key: str) -> Any:
        # The fields a UI reads of every event (turn, step, chunk, message, the splice's) repeat
        # these lines inline instead: a UI folds each event of a stream, and a call per field
        # read is a measurable part of that (docs/performance.md, "The UI projections and the
        # typed views").
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        return data.get(key) if data.__class__ is dict else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(seq={self.seq}, data={self.data!r})"


class _Carrying(EventView):
    """A view whose payload holds one message, read once."""

    __slots__ = ("_message",)

    def __init__(self, event: EventLike) -> None:
        # EventView's, inline: a view is built per event, and a super() call costs as much
        self.event = event
        self._source = event if event.__class__ is Event else _Envelope(event)  # type: ignore[arg-type]
        self._data = _UNSET
        self._message: Optional[MessageView] = None

    def _read_message(self) -> MessageView:
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("message") if data.__class__ is dict else None
        return MessageView(value) if value.__class__ is dict else message(value)

    @property
    def message(self) -> MessageView:
        view = self._message
        if view is None:
            view = self._message = self._read_message()
        return view


class _Turn(EventView):
    __slots__ = ()

    @property
    def turn(self) -> int:
        """The turn number (1 for a session's first turn)."""
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("turn") if data.__class__ is dict else None
        return value if value.__class__ is int else 0


class _Step(_Turn):
    __slots__ = ()

    @property
    def step(self) -> int:
        """The step number within the turn (from 1)."""
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("step") if data.__class__ is dict else None
        return value if value.__class__ is int else 0


class TurnStart(_Turn):
    """``turn/start {turn[, continues]}``: a turn began; ``continues`` names the interrupted
    turn whose input a continuation answers (docs/durability.md, "Crashed turns are answered")."""

    __slots__ = ()
    TYPE = "turn/start"

    @property
    def continues(self) -> Optional[int]:
        """The interrupted turn this one continues, or ``None`` for an ordinary turn."""
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("continues") if data.__class__ is dict else None
        return value if value.__class__ is int else None


class TurnEnd(_Turn):
    """``turn/end {turn, reason}``: a turn ended; ``reason.kind`` says how."""

    __slots__ = ()
    TYPE = "turn/end"

    @property
    def reason(self) -> Ending:
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("reason") if data.__class__ is dict else None
        return Ending(value if value.__class__ is dict else _EMPTY)


class StepStart(_Step):
    """``step/start {turn, step}``."""

    __slots__ = ()
    TYPE = "step/start"


class StepEnd(_Step):
    """``step/end {turn, step}``."""

    __slots__ = ()
    TYPE = "step/end"


class UserMessageEvent(_Carrying):
    """``user/message``: a user message entered a step (``message``); the payload is the
    message itself."""

    __slots__ = ()
    TYPE = "user/message"

    def _read_message(self) -> MessageView:
        return message(self.data)


class RequestHeader(EventView):
    """``request/header {options, instructions?}``: the options (and instructions) the model
    requests of this loop start from, written when they change."""

    __slots__ = ()
    TYPE = "request/header"

    @property
    def options(self) -> Dict[str, Any]:
        return _dict(self._field("options"))

    @property
    def instructions(self) -> Optional[str]:
        return _str(self._field("instructions"))


class InstructionsChanged(EventView):
    """``agent/instructions {instructions}``: the loop's instructions from now on (``None``:
    none)."""

    __slots__ = ()
    TYPE = "agent/instructions"

    @property
    def instructions(self) -> Optional[str]:
        return _str(self._field("instructions"))


class AssistantChunk(_Step):
    """``assistant/chunk {turn, step, chunk}``: one chunk of a streamed reply, as it arrived."""

    __slots__ = ()
    TYPE = "assistant/chunk"

    @property
    def chunk(self) -> Chunk:
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("chunk") if data.__class__ is dict else None
        if value.__class__ is not dict:
            value = _EMPTY
        return _CHUNKS.get(value.get("type"), OtherChunk)(value)  # chunk(value), a call less


class AssistantMessageEvent(_Carrying, _Step):
    """``assistant/message {turn, step, message, interrupted?, usage?}``: the model's reply
    (``message``; for a stream, assembled from the chunks it cites)."""

    __slots__ = ()
    TYPE = "assistant/message"

    @property
    def interrupted(self) -> bool:
        """The turn was cancelled mid-stream: the message holds what arrived."""
        return self._field("interrupted") is True

    @property
    def usage(self) -> Optional[Usage]:
        value = self._field("usage")
        return Usage(value) if isinstance(value, dict) else None


class ToolCall(_Step):
    """``tool/call {turn, step, callId, name, arguments, effect?, onInDoubt?}``: a tool call
    started (its write-ahead record: logged and flushed before the body runs)."""

    __slots__ = ()
    TYPE = "tool/call"

    @property
    def call_id(self) -> str:
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("callId") if data.__class__ is dict else None
        return value if value.__class__ is str else ""

    @property
    def name(self) -> str:
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("name") if data.__class__ is dict else None
        return value if value.__class__ is str else ""

    @property
    def arguments(self) -> Any:
        """The arguments as the model wrote them: normally JSON text."""
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("arguments") if data.__class__ is dict else None
        return "" if value is None else value

    @property
    def effect(self) -> str:
        """The tool's effect class: ``"read"``, ``"idempotent"`` or ``"write"`` (absent: write)."""
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("effect") if data.__class__ is dict else None
        return value if value in ("read", "idempotent") else "write"

    @property
    def on_in_doubt(self) -> str:
        """What becomes of the call if it is in doubt: ``"fail"`` (absent), ``"retry"``,
        ``"reconcile"`` or ``"ask"``."""
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("onInDoubt") if data.__class__ is dict else None
        return value if value in ("retry", "reconcile", "ask") else "fail"


class ToolResultEvent(_Carrying, _Step):
    """``tool/result {turn, step, message, error?, meta?, concludesTurn?}``: a call's result
    ``message``, with the failure when the tool failed."""

    __slots__ = ("_result",)
    TYPE = "tool/result"

    def __init__(self, event: EventLike) -> None:
        self.event = event
        self._source = event if event.__class__ is Event else _Envelope(event)  # type: ignore[arg-type]
        self._data = _UNSET
        self._message = None
        self._result: Any = _UNSET

    def _block(self) -> Optional[ToolResultBlock]:
        block = self._result
        if block is _UNSET:
            block = self._result = self.message.tool_result
        return block  # type: ignore[no-any-return]

    @property
    def call_id(self) -> str:
        """The call this result answers."""
        block = self._block()
        return (block.tool_call_id if block is not None else None) or self.message.source.call_id or ""

    @property
    def text(self) -> str:
        """The result's text."""
        block = self._block()
        return block.text if block is not None else ""

    @property
    def is_error(self) -> bool:
        """The result is an error (flagged so, or with an ``error``)."""
        block = self._block()
        return bool(block is not None and block.is_error) or bool(self._field("error"))

    @property
    def error(self) -> Optional[Failure]:
        value = self._field("error")
        return Failure(value) if isinstance(value, dict) else None

    @property
    def meta(self) -> Any:
        """The ``ToolResult.meta`` the tool returned, if any."""
        return self._field("meta")

    @property
    def concludes_turn(self) -> bool:
        """The result ended its turn (``ToolResult(concludes_turn=True)``): the model was not
        asked again, and the result answers the turn's input."""
        return self._field("concludesTurn") is True


class InboxSpliced(EventView):
    """``agent/inbox/spliced {target, start, removedCount?, inserted, outcome?, by?}``: one change
    to the inbox's ``target`` list (a claim when it removes without ``outcome: "canceled"``;
    ``by`` names a claimant other than Kerman's loop)."""

    __slots__ = ()
    TYPE = "agent/inbox/spliced"

    @property
    def target(self) -> str:
        """``"next-turn"`` or ``"next-step"``."""
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("target") if data.__class__ is dict else None
        return value if value.__class__ is str else ""

    @property
    def start(self) -> int:
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("start") if data.__class__ is dict else None
        return value if value.__class__ is int else 0

    @property
    def removed_count(self) -> int:
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("removedCount") if data.__class__ is dict else None
        return value if value.__class__ is int else 0

    @property
    def inserted(self) -> List[MessageView]:
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("inserted") if data.__class__ is dict else None
        return [MessageView(m) if m.__class__ is dict else message(m) for m in value] if isinstance(value, list) else []

    @property
    def outcome(self) -> Optional[str]:
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        value = data.get("outcome") if data.__class__ is dict else None
        return value if value.__class__ is str else None

    @property
    def is_claim(self) -> bool:
        """It removes messages that go on into a turn (not a cancel)."""
        data = self._data
        if data is _UNSET:
            data = self._data = self._source.data
        if data.__class__ is not dict:
            return False
        count = data.get("removedCount")
        return count.__class__ is int and count > 0 and data.get("outcome") != "canceled"

    @property
    def by(self) -> Optional[Dict[str, Any]]:
        """The claimant of a claim made by a loop other than Kerman's (a framework's under
        ``KermanDurability``, e.g. ``{"kind": "pydantic-ai", "run": 1, "n": 0}``); ``None``
        for Kerman's own claims and every other splice."""
        value = self._field("by")
        return value if value.__class__ is dict else None


class LogDamaged(EventView):
    """``log/damaged {seqs, lines, backup}``: a placeholder a repair wrote at a lost seq
    (docs/format.md, "Repairing corruption")."""

    __slots__ = ()
    TYPE = "log/damaged"

    @property
    def seqs(self) -> List[int]:
        """The first and last lost seq of the run this one belongs to."""
        value = self._field("seqs")
        return list(value) if isinstance(value, list) else []

    @property
    def lines(self) -> Optional[List[int]]:
        value = self._field("lines")
        return list(value) if isinstance(value, list) else None

    @property
    def backup(self) -> Optional[str]:
        return _str(self._field("backup"))


class LogRepaired(EventView):
    """``log/repaired {backup, quarantine, dropped, lostSeqs, tornTailBytes}``: what a repair set
    aside and cut off."""

    __slots__ = ()
    TYPE = "log/repaired"

    @property
    def backup(self) -> Optional[str]:
        return _str(self._field("backup"))

    @property
    def quarantine(self) -> Optional[str]:
        return _str(self._field("quarantine"))

    @property
    def dropped(self) -> List[JsonObject]:
        """Each line set aside: ``line``, ``bytes``, ``seq``, ``detail``."""
        value = self._field("dropped")
        return [JsonObject(d) for d in value if isinstance(d, dict)] if isinstance(value, list) else []

    @property
    def lost_seqs(self) -> List[List[int]]:
        value = self._field("lostSeqs")
        return [list(run) for run in value if isinstance(run, list)] if isinstance(value, list) else []

    @property
    def torn_tail_bytes(self) -> int:
        return _int(self._field("tornTailBytes")) or 0


class OtherEvent(EventView):
    """An event of a type Kerman does not write (a plugin's, an application's): ``type`` and
    ``data`` as stored."""

    __slots__ = ()
