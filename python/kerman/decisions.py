"""Decisions (``docs/decisions.md``): what a ``before_tool`` gate returns, what a person decides,
and what the loop shows of a pending request.

A gate (``@loop.before_tool``, ``async def gate(call: ToolCall, next)``) returns ``await
next()`` (the default: :class:`Approve`, or :class:`Ask` for a tool registered with
``needs_approval``), :class:`Deny`, :class:`Edit` or :class:`Ask`. A person answers a pending
request with ``loop.decide(decision_id, Approve() | Deny(reason) | Edit(arguments) |
Answer(value))``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Dict, Optional, Union

from ._core import ToolCall
from .signal import Signal

if TYPE_CHECKING:
    from .loop import AgentLoop

__all__ = ["Approve", "Deny", "Edit", "Ask", "Answer", "InputRequired", "ToolCall", "PendingDecision", "Verdict", "Outcome"]


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
class InputRequired:
    """What a tool body returns when the call needs a person's input before it can finish (an
    MCP server's input-required result): the loop logs a request (``kind="input"``: ``message``
    as its note, ``schema`` the answer's JSON Schema, ``payload`` any JSON the tool needs to make
    the call again, such as a server's state token) and the turn waits. Once answered
    (``Answer(value)``, checked against ``schema``), the body runs again under the same
    ``tool/call``, in this process or another, with ``ctx.input`` = ``{"payload": ...,
    "answer": ..., "decisionId": ...}``; ``Deny(reason)`` declines (the call's result is a
    denial). See ``docs/decisions.md#calls-that-started``."""

    message: Optional[str] = None
    schema: Optional[Dict[str, Any]] = None
    payload: Any = None


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


def outcome_of(data: Any) -> Outcome:
    """The decision a JSON object names: ``{"kind": "approve"}``, ``{"kind": "deny", "reason":
    ...}``, ``{"kind": "edit", "arguments": {...}}`` or ``{"kind": "answer", "value": ...}`` (how
    ``PostgresStore.decide`` stages it and ``kerman serve`` takes it). Raises ``ValueError``
    naming what is wrong."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "approve":
        return Approve()
    if kind == "deny":
        reason = data.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise ValueError(f"a denial's reason is a string, got {reason!r}")
        return Deny(reason)
    if kind == "edit":
        arguments = data.get("arguments")
        if not isinstance(arguments, dict):
            raise ValueError(f"an edit's arguments are a JSON object, got {arguments!r}")
        return Edit(arguments)
    if kind == "answer":
        if "value" not in data:
            raise ValueError("an answer needs a value")
        return Answer(data["value"])
    raise ValueError(f'a decision is "approve", "deny", "edit" or "answer", got {kind!r}')


def check_answer(decision_id: str, schema: Any, value: Any) -> None:
    """Refuses ``value`` as the answer to request ``decision_id`` unless it is valid against the
    request's JSON Schema ``schema`` (validated with ``jsonschema``, in the draft the schema's
    ``$schema`` names, 2020-12 otherwise; ``format`` is not asserted). Raises
    :class:`kerman.DecisionError` (``reason="invalid"``) naming the first problem and where it
    is. Every way of deciding runs it before anything is appended (``loop.decide``,
    ``FileStore.decide``, and the owner applying ``PostgresStore.decide``)."""
    from .errors import DecisionError

    try:
        import jsonschema  # type: ignore[import-untyped,unused-ignore]
    except ImportError:  # an optional dependency: kerman[decisions]
        raise DecisionError(
            f"decision {decision_id!r} asks for an answer matching a JSON Schema, and checking one needs "
            "the jsonschema package (pip install 'kerman[decisions]')",
            "invalid",
        ) from None
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise DecisionError(f"decision {decision_id!r} has a schema that is not valid JSON Schema: {e.message}", "invalid") from None
    error = jsonschema.exceptions.best_match(cls(schema).iter_errors(value))
    if error is not None:
        raise DecisionError(
            f"the answer {value!r} does not match the schema of decision {decision_id!r}: {error.message} (at {error.json_path})",
            "invalid",
        )


def pending(log: Any) -> list[PendingDecision]:
    """The requests of session ``log`` waiting for a person, oldest first: what the owner's
    ``loop.decisions`` lists, read by a process that only follows the session (``store.follow``)."""
    from ._core import pending_decisions

    return [PendingDecision(**d) for d in pending_decisions(log)]


#: What a ``before_tool`` gate returns.
Verdict = Union[Approve, Deny, Edit, Ask]
#: What a person decides.
Outcome = Union[Approve, Deny, Edit, Answer]


@dataclass
class _ToolCallFields:
    """The field table of :class:`ToolCall` (a native class, ``kerman._core``): attached to it
    so the ``dataclasses`` functions (``fields``, ``replace``, ``asdict``) keep working on the
    payload, which was a dataclass before it was native (``CHANGELOG.md``)."""

    loop: AgentLoop
    call_id: str
    name: str
    arguments: Any
    turn: int
    step: int
    signal: Signal


ToolCall.__dataclass_fields__ = _ToolCallFields.__dataclass_fields__
ToolCall.__dataclass_params__ = _ToolCallFields.__dataclass_params__  # type: ignore[attr-defined]
if hasattr(_ToolCallFields, "__replace__"):  # Python 3.13+: copy.replace
    ToolCall.__replace__ = _ToolCallFields.__replace__  # type: ignore[attr-defined,unused-ignore]


@dataclass(frozen=True)
class PendingDecision:
    """A request waiting for a person (``loop.decisions``). ``arguments`` are the call's exact
    arguments (JSON text), ``digest`` their SHA-256; ``kind`` is ``"approval"``,
    ``"answer"``, ``"in-doubt"`` (a call that started and whose process died: its ``note`` says
    what may be decided), ``"input"`` (a call that needs input: answer its ``schema``) or
    ``"budget"`` (a spent budget stopped a model request: no call, ``arguments`` holds the
    numbers that stopped it; ``Approve()`` or ``Deny(reason)``);
    ``expires_at`` is epoch milliseconds or ``None``. ``requester`` names the framework that
    asked (the ``for`` of its ``decision/requested``, e.g. a pydantic-ai run under
    ``KermanDurability``; its ``turn`` and ``step`` are 0); ``None`` for the loop's own requests."""

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
    requester: Optional[Dict[str, Any]] = None

    def __repr__(self) -> str:
        note = f" note={self.note!r}" if self.note else ""
        requester = f" for={json.dumps(self.requester, separators=(',', ':'))}" if self.requester is not None else ""
        return f"<PendingDecision {self.decision_id} {self.kind} {self.name}({self.arguments}) call={self.call_id}{note}{requester}>"
