"""The log's grammar as types: every event type Kerman writes, with a typed view of its payload.

``view(event)`` gives the view of any ``kerman.Event`` (from ``log.events()``, ``log.tail()``,
``log.subscribe``) or of its ``to_dict()`` form: a ``TurnEnd``, a ``ToolCall``, an
``AssistantChunk``, ... with the payload's fields as attributes, or an ``OtherEvent`` for a type
Kerman does not write. Narrow with ``isinstance`` (or ``match``)::

    for v in kerman.events.views(log.events()):
        if isinstance(v, kerman.events.AssistantChunk) and isinstance(v.chunk, kerman.events.TextDelta):
            print(v.chunk.text, end="")

Views are cheap: they read nothing until a field is asked for, and keep the payload as stored
(``.data``; nested views have ``.raw``), unknown fields included. The type names are constants
here too (``TURN_END``, ...), and ``TYPES`` maps each to its view class.
"""

from __future__ import annotations

from typing import AsyncIterable, AsyncIterator, Dict, Iterable, Iterator, Mapping

from .._core import Event
from ._compaction import ContextCompacted
from ._decisions import DecisionRequested, DecisionResolved, OutputValidated
from ._progress import ToolProgress
from ._types import (
    AssistantChunk,
    AssistantMessageEvent,
    EventLike,
    EventView,
    InboxSpliced,
    InstructionsChanged,
    LogDamaged,
    LogRepaired,
    OtherEvent,
    RequestHeader,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResultEvent,
    TurnEnd,
    TurnStart,
    UserMessageEvent,
)
from ._values import (
    Block,
    BudgetStop,
    Cause,
    Chunk,
    Ending,
    Failure,
    FinishChunk,
    JsonObject,
    MessageView,
    OtherBlock,
    OtherChunk,
    ProviderDataChunk,
    ReasoningBlock,
    ReasoningDelta,
    Source,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallChunk,
    ToolResultBlock,
    Usage,
    UsageChunk,
    block,
    chunk,
    message,
)

__all__ = [
    "view",
    "views",
    "aviews",
    "TYPES",
    "EventLike",
    "TURN_START",
    "TURN_END",
    "STEP_START",
    "STEP_END",
    "USER_MESSAGE",
    "REQUEST_HEADER",
    "INSTRUCTIONS",
    "ASSISTANT_CHUNK",
    "ASSISTANT_MESSAGE",
    "TOOL_CALL",
    "TOOL_RESULT",
    "INBOX_SPLICED",
    "LOG_DAMAGED",
    "LOG_REPAIRED",
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
    "DECISION_REQUESTED",
    "DECISION_RESOLVED",
    "DecisionRequested",
    "DecisionResolved",
    "OUTPUT_VALIDATED",
    "OutputValidated",
    "CONTEXT_COMPACTED",
    "ContextCompacted",
    "TOOL_PROGRESS",
    "ToolProgress",
    "JsonObject",
    "MessageView",
    "Source",
    "Block",
    "TextBlock",
    "ReasoningBlock",
    "ToolCallBlock",
    "ToolResultBlock",
    "OtherBlock",
    "Chunk",
    "TextDelta",
    "ReasoningDelta",
    "ToolCallChunk",
    "UsageChunk",
    "FinishChunk",
    "OtherChunk",
    "ProviderDataChunk",
    "Failure",
    "Cause",
    "Ending",
    "BudgetStop",
    "Usage",
    "message",
    "block",
    "chunk",
]

TURN_START = TurnStart.TYPE
TURN_END = TurnEnd.TYPE
STEP_START = StepStart.TYPE
STEP_END = StepEnd.TYPE
USER_MESSAGE = UserMessageEvent.TYPE
REQUEST_HEADER = RequestHeader.TYPE
INSTRUCTIONS = InstructionsChanged.TYPE
ASSISTANT_CHUNK = AssistantChunk.TYPE
ASSISTANT_MESSAGE = AssistantMessageEvent.TYPE
TOOL_CALL = ToolCall.TYPE
TOOL_RESULT = ToolResultEvent.TYPE
INBOX_SPLICED = InboxSpliced.TYPE
LOG_DAMAGED = LogDamaged.TYPE
LOG_REPAIRED = LogRepaired.TYPE
DECISION_REQUESTED = DecisionRequested.TYPE
DECISION_RESOLVED = DecisionResolved.TYPE
OUTPUT_VALIDATED = OutputValidated.TYPE
CONTEXT_COMPACTED = ContextCompacted.TYPE
TOOL_PROGRESS = ToolProgress.TYPE

#: Every event type Kerman writes, and its view class.
TYPES: Dict[str, type[EventView]] = {
    cls.TYPE: cls
    for cls in (
        TurnStart,
        TurnEnd,
        StepStart,
        StepEnd,
        UserMessageEvent,
        RequestHeader,
        InstructionsChanged,
        AssistantChunk,
        AssistantMessageEvent,
        ToolCall,
        ToolResultEvent,
        InboxSpliced,
        LogDamaged,
        LogRepaired,
        DecisionRequested,
        DecisionResolved,
        OutputValidated,
        ContextCompacted,
        ToolProgress,
    )
}


def view(event: EventLike) -> EventView:
    """The typed view of ``event`` (a ``kerman.Event`` or its ``to_dict()`` form): the class
    ``TYPES`` names for its type, ``OtherEvent`` for any other type."""
    if event.__class__ is Event:  # the common case first: one class check, no ABC lookup
        return TYPES.get(event.type, OtherEvent)(event)
    if isinstance(event, Event):
        kind = event.type
    elif event.__class__ is dict or isinstance(event, Mapping):  # a dict skips the ABC's subclass check
        value = event.get("type")
        if not isinstance(value, str) or "seq" not in event:
            raise TypeError(f"expected a kerman.Event or an event dict with seq, type and data, got {event!r:.80}")
        kind = value
    else:
        raise TypeError(f"expected a kerman.Event or an event dict with seq, type and data, got {type(event).__name__}")
    return TYPES.get(kind, OtherEvent)(event)


def views(events: Iterable[EventLike]) -> Iterator[EventView]:
    """The view of each event of ``events`` (``log.events()``, a list), lazily."""
    for event in events:
        yield view(event)


async def aviews(events: AsyncIterable[EventLike]) -> AsyncIterator[EventView]:
    """The view of each event of an async iterable (``log.tail()``), as it comes."""
    async for event in events:
        yield view(event)
