"""Decisions (``docs/decisions.md``): what a ``before_tool`` gate returns, what a person decides,
and what the loop shows of a pending request.

A gate (``@loop.before_tool``, ``async def gate(call: ToolCall, next)``) returns ``await
next()`` (the default: :class:`Approve`, or :class:`Ask` for a tool registered with
``needs_approval``), :class:`Deny`, :class:`Edit` or :class:`Ask`. A person answers a pending
request with ``loop.decide(decision_id, Approve() | Deny(reason) | Edit(arguments) |
Answer(value))``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Dict, Optional, Union

from .signal import Signal

if TYPE_CHECKING:
    from .loop import AgentLoop

__all__ = ["Approve", "Deny", "Edit", "Ask", "Answer", "ToolCall", "PendingDecision", "Verdict", "Outcome"]


@dataclass(frozen=True)
class Approve:
    """Run the call as the model gave it (a gate's default; a person's approval)."""

    kind = "approve"


@dataclass(frozen=True)
class Deny:
    """Do not run the call; ``reason`` goes to the model in the call's error result."""

    reason: Optional[str] = None
    kind = "deny"


@dataclass(frozen=True)
class Edit:
    """Run the call with ``arguments`` (a JSON object) instead of the model's."""

    arguments: Dict[str, Any]
    kind = "edit"


@dataclass(frozen=True)
class Answer:
    """A person's answer to a request that asked for one (``Ask(schema=...)``): the call's
    result is the answer (a ``str`` as it is, any other JSON value as its JSON text); the tool
    does not run."""

    value: Any
    kind = "answer"


@dataclass(frozen=True)
class Ask:
    """Ask a person: the call waits, logged as ``decision/requested``, until ``loop.decide``.
    ``note`` is shown to the person; a ``schema`` (JSON Schema) asks for an :class:`Answer`
    rather than an approval; ``expires_in`` (seconds from now) or ``expires_at`` (a
    ``datetime`` or epoch seconds) resolves the request ``expired`` when nobody decided."""

    note: Optional[str] = None
    schema: Optional[Dict[str, Any]] = None
    expires_in: Optional[float] = None
    expires_at: Union[datetime, float, None] = None
    kind = "ask"

    def __post_init__(self) -> None:
        if self.expires_in is not None and self.expires_at is not None:
            raise ValueError("Ask takes expires_in or expires_at, not both")

    @property
    def deadline_ms(self) -> Optional[int]:
        """The deadline in epoch milliseconds (``expires_in`` counts from now), or ``None``."""
        if self.expires_in is not None:
            return int((time.time() + float(self.expires_in)) * 1000)
        if isinstance(self.expires_at, datetime):
            return int(self.expires_at.timestamp() * 1000)
        if self.expires_at is not None:
            return int(float(self.expires_at) * 1000)
        return None


#: What a ``before_tool`` gate returns.
Verdict = Union[Approve, Deny, Edit, Ask]
#: What a person decides.
Outcome = Union[Approve, Deny, Edit, Answer]


@dataclass
class ToolCall:
    """The ``before_tool`` payload: one call of the model's, before it runs. ``arguments`` are
    parsed (``None`` when they are not JSON; the call then fails when it runs)."""

    loop: AgentLoop
    call_id: str
    name: str
    arguments: Any
    turn: int
    step: int
    signal: Signal


@dataclass(frozen=True)
class PendingDecision:
    """A request waiting for a person (``loop.decisions``). ``arguments`` are the call's exact
    arguments (JSON text), ``digest`` their SHA-256; ``kind`` is ``"approval"`` or
    ``"answer"``; ``expires_at`` is epoch milliseconds or ``None``."""

    decision_id: str
    call_id: str
    name: str
    arguments: str
    digest: str
    kind: str
    note: Optional[str]
    schema: Optional[Dict[str, Any]]
    expires_at: Optional[int]
    turn: int
    step: int

    def __repr__(self) -> str:
        note = f" note={self.note!r}" if self.note else ""
        return f"<PendingDecision {self.decision_id} {self.kind} {self.name}({self.arguments}) call={self.call_id}{note}>"
