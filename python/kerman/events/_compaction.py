"""The view of ``context/compacted``: a span of the log that the history shows compacted
(docs/context.md, "Compaction")."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ._types import EventView
from ._values import MessageView, Usage, _int, _str, message

__all__ = ["ContextCompacted"]


class ContextCompacted(EventView):
    """``context/compacted {first, last, messages, pinned, strategy, reason, model?, usage?,
    native?, turn?}``: from this record on, the history shows ``messages`` in place of the
    surface events ``first..=last`` (the pinned ones kept verbatim after them); ``messages``
    ``None`` is a revert (the span's own messages come back). The raw events stay."""

    __slots__ = ()
    TYPE = "context/compacted"

    @property
    def first(self) -> int:
        return _int(self._field("first")) or 0

    @property
    def last(self) -> int:
        return _int(self._field("last")) or 0

    @property
    def messages(self) -> Optional[List[MessageView]]:
        """What stands for the span (``None``: a revert)."""
        value = self._field("messages")
        return [message(m) for m in value] if isinstance(value, list) else None

    @property
    def pinned(self) -> List[int]:
        value = self._field("pinned")
        return [s for s in value if s.__class__ is int] if isinstance(value, list) else []

    @property
    def strategy(self) -> str:
        return _str(self._field("strategy")) or ""

    @property
    def reason(self) -> str:
        """What triggered it: ``"manual"``, ``"threshold"`` or ``"context-length"``."""
        return _str(self._field("reason")) or ""

    @property
    def model(self) -> Optional[str]:
        """The model that wrote the summary (an LLM summary only)."""
        return _str(self._field("model"))

    @property
    def usage(self) -> Optional[Usage]:
        value = self._field("usage")
        return Usage(value) if isinstance(value, dict) else None

    @property
    def native(self) -> Optional[Dict[str, Any]]:
        """A provider's own compaction item (``{"provider", "item"}``), sent only to it."""
        value = self._field("native")
        return value if isinstance(value, dict) else None

    @property
    def turn(self) -> Optional[int]:
        """The turn it happened in (``None``: between turns)."""
        return _int(self._field("turn"))
