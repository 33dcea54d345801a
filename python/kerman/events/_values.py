"""Typed views of the JSON values inside event payloads: messages and their content blocks,
stream chunks, failures, usage, turn endings and abort causes.

Each view wraps the dict it reads (``.raw``, never copied) and reads a field only when it is
asked for, so building one costs an allocation. A field the payload lacks, or holds with another
JSON type, reads as ``None`` (or the documented default): the log keeps what older and newer
writers wrote, and a reader must not fail on it. Unknown keys stay in ``.raw``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

__all__ = [
    "JsonObject",
    "Source",
    "Block",
    "TextBlock",
    "ReasoningBlock",
    "ToolCallBlock",
    "ToolResultBlock",
    "OtherBlock",
    "MessageView",
    "Failure",
    "Cause",
    "Ending",
    "BudgetStop",
    "Usage",
    "Chunk",
    "TextDelta",
    "ReasoningDelta",
    "ToolCallChunk",
    "UsageChunk",
    "FinishChunk",
    "OtherChunk",
    "block",
    "chunk",
    "message",
]

_EMPTY: Dict[str, Any] = {}


# Exact classes: JSON decodes to exactly these, and a bool is not a count.
def _dict(value: Any) -> Dict[str, Any]:
    return value if value.__class__ is dict else _EMPTY


def _str(value: Any) -> Optional[str]:
    return value if value.__class__ is str else None


def _int(value: Any) -> Optional[int]:
    return value if value.__class__ is int else None


def join_text(blocks: List[Any]) -> str:
    """The text blocks of a content list joined by newlines, as ``Message.text`` joins them."""
    return "\n".join(b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))


class JsonObject:
    """A read-only view of one JSON object: typed properties for the fields Kerman writes,
    ``raw`` (the dict itself) for everything, unknown keys included."""

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw: Dict[str, Any] = raw if raw.__class__ is dict else dict(raw)

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value of ``key`` (for fields this view does not name)."""
        return self.raw.get(key, default)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JsonObject) and type(other) is type(self) and other.raw == self.raw

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.raw!r})"


# ---- messages --------------------------------------------------------------------------------


class Source(JsonObject):
    """Where a message came from: ``kind`` ``"user"``, ``"model"``, ``"tool"``, ``"context"``,
    ``"plugin"`` or another kind a writer chose."""

    __slots__ = ()

    @property
    def kind(self) -> Optional[str]:
        value = self.raw.get("kind")
        return value if value.__class__ is str else None

    @property
    def call_id(self) -> Optional[str]:
        """The call a tool result answers (source ``{kind: "tool", callId}``)."""
        value = self.raw.get("callId")
        return value if value.__class__ is str else None

    @property
    def plugin(self) -> Optional[str]:
        """The plugin that queued the message (source ``{kind: "plugin", plugin}``)."""
        return _str(self.raw.get("plugin"))


class Block(JsonObject):
    """One content block; ``type`` says which (``text``, ``reasoning``, ``tool-call``,
    ``tool-result``, or another type kept as an ``OtherBlock``)."""

    __slots__ = ()

    @property
    def type(self) -> Optional[str]:
        return _str(self.raw.get("type"))


class TextBlock(Block):
    """``{"type": "text", "text"}``."""

    __slots__ = ()

    @property
    def text(self) -> str:
        return _str(self.raw.get("text")) or ""


class ReasoningBlock(Block):
    """``{"type": "reasoning", "text"}``: what the model thought, as it reported it."""

    __slots__ = ()

    @property
    def text(self) -> str:
        return _str(self.raw.get("text")) or ""


class ToolCallBlock(Block):
    """``{"type": "tool-call", "id", "name", "arguments"}``; ``arguments`` is the JSON text the
    model wrote (a value other than a str is kept as written, in ``raw``)."""

    __slots__ = ()

    @property
    def id(self) -> str:
        value = self.raw.get("id")
        return value if isinstance(value, str) else str(value)

    @property
    def name(self) -> str:
        value = self.raw.get("name")
        return value if value.__class__ is str else ""

    @property
    def arguments(self) -> Any:
        """The arguments as written: normally their JSON text (``""`` when absent)."""
        return self.raw.get("arguments", "")


class ToolResultBlock(Block):
    """``{"type": "tool-result", "toolCallId", "content", "isError"?}``."""

    __slots__ = ()

    @property
    def tool_call_id(self) -> Optional[str]:
        value = self.raw.get("toolCallId")
        return value if value.__class__ is str else None

    @property
    def content(self) -> List[Block]:
        value = self.raw.get("content")
        return [block(b) for b in value if isinstance(b, dict)] if isinstance(value, list) else []

    @property
    def text(self) -> str:
        """The text blocks of ``content``, joined by newlines."""
        value = self.raw.get("content")
        if isinstance(value, str):
            return value
        return join_text(value) if isinstance(value, list) else ""

    @property
    def is_error(self) -> bool:
        return bool(self.raw.get("isError"))


class OtherBlock(Block):
    """A block of a type Kerman does not name (an image, a plugin's): ``raw`` holds it."""

    __slots__ = ()


_BLOCKS: Dict[Any, type[Block]] = {
    "text": TextBlock,
    "reasoning": ReasoningBlock,
    "tool-call": ToolCallBlock,
    "tool-result": ToolResultBlock,
}


def block(raw: Mapping[str, Any]) -> Block:
    """The view of one content block."""
    return _BLOCKS.get(raw.get("type"), OtherBlock)(raw)


class MessageView(JsonObject):
    """A message as the log holds it (``{id, role, source, content}``); ``user/message``,
    ``assistant/message`` and ``tool/result`` carry one. ``kerman.Message.from_dict(view.raw)``
    gives the message value."""

    __slots__ = ("_blocks",)

    def __init__(self, raw: Mapping[str, Any]) -> None:
        # JsonObject's, inline: a view is built per event, and a super() call costs as much
        self.raw = raw if raw.__class__ is dict else dict(raw)
        self._blocks: Optional[List[Block]] = None

    @property
    def id(self) -> str:
        value = self.raw.get("id")
        return value if value.__class__ is str else ""

    @property
    def role(self) -> Optional[str]:
        return _str(self.raw.get("role"))

    @property
    def source(self) -> Source:
        value = self.raw.get("source")
        return Source(value if value.__class__ is dict else _EMPTY)

    @property
    def content(self) -> List[Block]:
        """The content blocks' views (read once)."""
        blocks = self._blocks
        if blocks is None:
            value = self.raw.get("content")
            blocks = self._blocks = [block(b) for b in value if isinstance(b, dict)] if isinstance(value, list) else []
        return blocks

    def _blocks_of(self, kind: str) -> List[Dict[str, Any]]:
        """The raw blocks of one type: the accessors below read these rather than building a
        view of every block."""
        value = self.raw.get("content")
        if not isinstance(value, list):
            return []
        return [b for b in value if isinstance(b, dict) and b.get("type") == kind]

    @property
    def text(self) -> str:
        """The text blocks joined by newlines (a str content is its own text)."""
        value = self.raw.get("content")
        if isinstance(value, str):
            return value
        return join_text(value) if isinstance(value, list) else ""

    @property
    def reasoning(self) -> str:
        """The reasoning blocks' text joined by newlines."""
        return "\n".join(text if (text := b.get("text")).__class__ is str else "" for b in self._blocks_of("reasoning"))

    @property
    def tool_calls(self) -> List[ToolCallBlock]:
        """The tool-call blocks, in order."""
        return [ToolCallBlock(b) for b in self._blocks_of("tool-call")]

    @property
    def tool_result(self) -> Optional[ToolResultBlock]:
        """The first tool-result block (a tool result message has exactly one)."""
        value = self.raw.get("content")
        if isinstance(value, list):
            for b in value:
                if isinstance(b, dict) and b.get("type") == "tool-result":
                    return ToolResultBlock(b)
        return None


def message(value: Any) -> MessageView:
    """The view of a message payload (a dict, or a ``kerman.Message``)."""
    if isinstance(value, dict):
        return MessageView(value)
    to_dict = getattr(value, "to_dict", None)
    return MessageView(to_dict() if callable(to_dict) else _EMPTY)


# ---- failures and endings ----------------------------------------------------------------------


class Failure(JsonObject):
    """A failure: a failed turn's ``error`` (``turn/end {kind: "error"}``), a tool's
    ``tool/result`` ``error``, a finish chunk's ``error``. ``message`` and ``code`` are always
    written; the rest when known. A writer's extra keys stay in ``raw``."""

    __slots__ = ()

    @property
    def message(self) -> str:
        value = self.raw.get("message")
        return value if value.__class__ is str else ""

    @property
    def code(self) -> Optional[str]:
        """``"UNKNOWN"``, ``"TOOL_ERROR"``, ``"INVALID_ARGUMENTS"``, a provider's code, ..."""
        value = self.raw.get("code")
        return value if value.__class__ is str else None

    @property
    def name(self) -> Optional[str]:
        """A tool error's exception class (``ValueError``, ``CancelledError``, ...)."""
        return _str(self.raw.get("name"))

    @property
    def exception_type(self) -> Optional[str]:
        """A failed turn's exception class, when an exception caused it."""
        return _str(self.raw.get("exceptionType"))

    @property
    def function(self) -> Optional[str]:
        """The qualified name of the user function the exception came out of."""
        return _str(self.raw.get("function"))

    @property
    def traceback(self) -> Optional[str]:
        return _str(self.raw.get("traceback"))

    @property
    def status(self) -> Optional[int]:
        """A provider's HTTP status."""
        return _int(self.raw.get("status"))

    @property
    def retry_after_ms(self) -> Optional[int]:
        return _int(self.raw.get("retryAfterMs"))

    @property
    def request_id(self) -> Optional[str]:
        return _str(self.raw.get("requestId"))

    @property
    def call_id(self) -> Optional[str]:
        """A tool bug's call id."""
        return _str(self.raw.get("callId"))

    @property
    def tool(self) -> Optional[str]:
        """A tool bug's tool name."""
        return _str(self.raw.get("tool"))


class Cause(JsonObject):
    """Why a turn was aborted: ``kind`` ``"user"``, ``"parent"``, ``"disposed"``, ``"hook"`` (with
    a ``reason``), ``"interrupt"`` or ``"rollback"`` (a followup sent with that ``on_busy``) or
    any kind ``loop.cancel()`` was given."""

    __slots__ = ()

    @property
    def kind(self) -> Optional[str]:
        return _str(self.raw.get("kind"))

    @property
    def reason(self) -> Optional[str]:
        return _str(self.raw.get("reason"))


class Ending(JsonObject):
    """``turn/end``'s ``reason``: ``kind`` is ``"completed"``, ``"max-tokens"``, ``"blocked"``
    (``blocked_reason``), ``"error"`` (``error``), ``"aborted"`` (``cause``),
    ``"interrupted"`` (a closer's, for a turn its process never ended) or ``"budget"``
    (``budget``: the loop's budget was spent)."""

    __slots__ = ()

    @property
    def kind(self) -> Optional[str]:
        value = self.raw.get("kind")
        return value if value.__class__ is str else None

    @property
    def error(self) -> Optional[Failure]:
        """The failure of an ``error`` ending."""
        value = self.raw.get("error")
        return Failure(value) if isinstance(value, dict) else None

    @property
    def cause(self) -> Optional[Cause]:
        """The abort cause of an ``aborted`` ending."""
        value = self.raw.get("reason")
        return Cause(value) if isinstance(value, dict) else None

    @property
    def blocked_reason(self) -> Optional[str]:
        """The reason a ``pre_step`` listener gave to ``Reject`` (``blocked``)."""
        return _str(self.raw.get("reason"))

    @property
    def rolled_back(self) -> bool:
        """Whether the turn was rolled back (aborted with cause ``rollback``): its messages are
        out of the history from this ``turn/end`` on, its events stay in the log."""
        if self.raw.get("kind") != "aborted":
            return False
        cause = self.raw.get("reason")
        return isinstance(cause, dict) and cause.get("kind") == "rollback"

    @property
    def budget(self) -> Optional[BudgetStop]:
        """What stopped a ``budget`` ending: the limit reached and the numbers."""
        return BudgetStop(self.raw) if self.raw.get("kind") == "budget" else None


class BudgetStop(JsonObject):
    """A ``budget`` ending (docs/usage.md#budgets): ``limit`` (``tokens``, ``requests``,
    ``toolCalls`` or ``usd``) reached ``max`` (``spent``), counted ``per`` turn or session,
    found ``at`` the claim or before a request; ``used`` is everything spent in that scope."""

    __slots__ = ()

    @property
    def limit(self) -> Optional[str]:
        return _str(self.raw.get("limit"))

    @property
    def max(self) -> Any:
        return self.raw.get("max")

    @property
    def spent(self) -> Any:
        return self.raw.get("spent")

    @property
    def per(self) -> Optional[str]:
        return _str(self.raw.get("per"))

    @property
    def at(self) -> Optional[str]:
        return _str(self.raw.get("at"))

    @property
    def used(self) -> Dict[str, Any]:
        return _dict(self.raw.get("used"))

    def text(self) -> str:
        """One line: ``tokens 1000 of 1000 per session, before a request``."""
        where = "when input was claimed" if self.at == "claim" else "before a request"
        return f"{self.limit} {_number(self.spent)} of {_number(self.max)} per {self.per}, {where}"


def _number(value: Any) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


class Usage(JsonObject):
    """Token counts, as every provider reports them (docs/providers.md, "Usage"); a count the
    provider did not report reads 0."""

    __slots__ = ()

    def _count(self, key: str) -> int:
        value = self.raw.get(key)
        return value if value.__class__ is int else 0

    @property
    def input(self) -> int:
        """Every prompt token, cached ones included."""
        return self._count("input")

    @property
    def output(self) -> int:
        """Every generated token, reasoning included."""
        return self._count("output")

    @property
    def cache_read(self) -> int:
        return self._count("cacheRead")

    @property
    def cache_write(self) -> int:
        return self._count("cacheWrite")

    @property
    def reasoning(self) -> int:
        return self._count("reasoning")


# ---- stream chunks -----------------------------------------------------------------------------


class Chunk(JsonObject):
    """One streamed chunk (``assistant/chunk``'s ``chunk``); ``type`` says which."""

    __slots__ = ()

    @property
    def type(self) -> Optional[str]:
        return _str(self.raw.get("type"))


class TextDelta(Chunk):
    """``{"type": "text-delta", "text"}``: appended to the current text block."""

    __slots__ = ()

    @property
    def text(self) -> str:
        value = self.raw.get("text")
        return value if value.__class__ is str else ""


class ReasoningDelta(Chunk):
    """``{"type": "reasoning-delta", "text"}``: appended to the current reasoning block."""

    __slots__ = ()

    @property
    def text(self) -> str:
        value = self.raw.get("text")
        return value if value.__class__ is str else ""


class ToolCallChunk(Chunk):
    """``{"type": "tool-call", "id", "name", "arguments"}``: one whole tool call."""

    __slots__ = ()

    @property
    def id(self) -> str:
        value = self.raw.get("id")
        return value if value.__class__ is str else ""

    @property
    def name(self) -> str:
        value = self.raw.get("name")
        return value if value.__class__ is str else ""

    @property
    def arguments(self) -> Any:
        return self.raw.get("arguments", "")


class UsageChunk(Chunk):
    """``{"type": "usage", ...}``: merged into the message's usage."""

    __slots__ = ()

    @property
    def usage(self) -> Usage:
        return Usage({k: v for k, v in self.raw.items() if k != "type"})


class FinishChunk(Chunk):
    """``{"type": "finish", "reason", "error"?, "model"?, "provider"?}``: how the reply ended
    (``"stop"``, ``"max-tokens"``, ``"error"``; ``"cancelled"``, written by the loop, for a
    request a cancellation cut before anything visible of it was logged). ``model`` and
    ``provider`` name the model that failed, on the failed finish a ``Fallback`` yields for each
    model it tried."""

    __slots__ = ()

    @property
    def model(self) -> Optional[str]:
        return _str(self.raw.get("model")) or None

    @property
    def provider(self) -> Optional[str]:
        return _str(self.raw.get("provider")) or None

    @property
    def reason(self) -> Optional[str]:
        return _str(self.raw.get("reason"))

    @property
    def error(self) -> Optional[Failure]:
        value = self.raw.get("error")
        return Failure(value) if isinstance(value, dict) else None


class OtherChunk(Chunk):
    """A chunk of a type Kerman does not name: ``raw`` holds it."""

    __slots__ = ()


_CHUNKS: Dict[Any, type[Chunk]] = {
    "text-delta": TextDelta,
    "reasoning-delta": ReasoningDelta,
    "tool-call": ToolCallChunk,
    "usage": UsageChunk,
    "finish": FinishChunk,
}


def chunk(raw: Mapping[str, Any]) -> Chunk:
    """The view of one stream chunk."""
    return _CHUNKS.get(raw.get("type"), OtherChunk)(raw)


class ProviderDataChunk(Chunk):
    """``{"type": "provider-data", "provider", "content"}``: a provider's opaque state for the
    reply (its own annotated blocks, docs/providers.md), yielded before ``usage``; only the
    provider that wrote it reads ``content``."""

    __slots__ = ()

    @property
    def provider(self) -> Optional[str]:
        """The protocol of the provider that wrote it (``"anthropic"``, ...)."""
        return _str(self.raw.get("provider"))

    @property
    def content(self) -> Optional[List[Any]]:
        """The provider's blocks, as it wrote them (``None`` when not a list)."""
        value = self.raw.get("content")
        return value if isinstance(value, list) else None


_CHUNKS["provider-data"] = ProviderDataChunk
__all__.append("ProviderDataChunk")
