"""What a tool body gets besides its arguments, and what it may return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from .._core import UserMessage
from ..signal import Signal

if TYPE_CHECKING:
    from ..loop import AgentLoop

__all__ = ["ToolContext", "ToolResult"]


@dataclass
class ToolContext:
    """What a tool body gets besides its arguments.

    ``idempotency_key`` is the same for every execution of this call (a retry of a call in
    doubt, in this process or another) and different for every other call: pass it to an API
    that deduplicates writes (``Idempotency-Key``). It is derived from the session's id and the
    log position of the call's ``tool/call`` record, never from what the model wrote.

    ``input`` is set when the call is made again after a person answered its request for input
    (the body returned :class:`kerman.InputRequired`): ``{"payload": ..., "answer": ...,
    "decisionId": ...}``; ``None`` otherwise."""

    call_id: str
    turn: int
    step: int
    signal: Signal
    loop: AgentLoop
    idempotency_key: str = ""
    input: Optional[Dict[str, Any]] = None


class ToolResult:
    """A tool's result. ``additional_contexts`` are queued in next-step right after the result
    is logged; ``concludes_turn`` lets the turn end without another model request."""

    __slots__ = ("content", "is_error", "concludes_turn", "additional_contexts", "meta")

    def __init__(
        self,
        content: Union[str, List[Dict[str, Any]]],
        is_error: bool = False,
        concludes_turn: bool = False,
        additional_contexts: Sequence[Union[UserMessage, str]] = (),
        meta: Any = None,
    ) -> None:
        if isinstance(additional_contexts, (str, bytes)):
            raise TypeError("additional_contexts must be a sequence of messages, not a str (wrap it in a list)")
        self.content = content
        self.is_error = is_error
        self.concludes_turn = concludes_turn
        self.additional_contexts = tuple(additional_contexts)
        self.meta = meta

    def __repr__(self) -> str:
        return f"ToolResult({self.content!r}, is_error={self.is_error}, concludes_turn={self.concludes_turn})"
