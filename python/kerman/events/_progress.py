"""The view of ``tool/progress``: a running tool call's progress, as its tool reported it (an
MCP server's progress notifications; docs/mcp.md, "Progress")."""

from __future__ import annotations

from typing import Optional

from ._types import _Step
from ._values import _str

__all__ = ["ToolProgress"]


def _number(value: object) -> Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


class ToolProgress(_Step):
    """``tool/progress {turn, step, callId, progress, total?, message?, task?}``: call
    ``callId`` of step ``step`` reported ``progress`` (of ``total``, when known). Not every
    update is logged: see docs/mcp.md, "Progress". ``task`` is the id of the server-side task
    the call became (an MCP task, docs/mcp.md, "Long-running tasks"), on the record that says
    so."""

    __slots__ = ()
    TYPE = "tool/progress"

    @property
    def call_id(self) -> str:
        return _str(self._field("callId")) or ""

    @property
    def progress(self) -> float:
        return _number(self._field("progress")) or 0

    @property
    def total(self) -> Optional[float]:
        return _number(self._field("total"))

    @property
    def message(self) -> Optional[str]:
        return _str(self._field("message"))

    @property
    def task(self) -> Optional[str]:
        return _str(self._field("task"))

    @property
    def fraction(self) -> Optional[float]:
        """``progress / total`` when the total is known and positive, else ``None``."""
        total = self.total
        return self.progress / total if total else None
