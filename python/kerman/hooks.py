"""The shapes user code meets at the loop's seams: the decisions a listener returns, the payloads
it gets, the model's request and reply, a live event, and the type of each kind of listener."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Dict, List, Literal, Optional, Protocol, Sequence, TypeVar, Union

from ._core import UserMessage
from .signal import Signal

if TYPE_CHECKING:
    from .loop import AgentLoop

__all__ = [
    "Enter",
    "Reject",
    "Retry",
    "Refuse",
    "Decision",
    "Next",
    "PreStepListener",
    "BeforeRequestListener",
    "RequestErrorListener",
    "InsertTransform",
    "Target",
    "PreStep",
    "ModelRequest",
    "ModelReply",
    "RequestFailure",
    "TurnStopping",
    "LiveEvent",
    "Model",
]


class Enter:
    """Pre-step decision: enter the step with ``messages`` as its user messages."""

    kind = "enter"
    __slots__ = ("messages",)

    def __init__(self, messages: Sequence[Union[UserMessage, str]]) -> None:
        if isinstance(messages, (str, bytes)):
            raise TypeError("Enter needs a list of messages, not a str (wrap it: Enter([text]))")
        # A str is the user message the loop would make of it, so ``.messages`` is typed as
        # messages for the listeners downstream (anything else is refused when the loop reads it).
        self.messages: List[UserMessage] = [UserMessage(m) if isinstance(m, str) else m for m in messages]

    def __repr__(self) -> str:
        return f"Enter({self.messages!r})"


class Reject:
    """Pre-step decision: reject the claimed batch; the turn ends ``blocked``."""

    kind = "reject"
    __slots__ = ("reason",)

    def __init__(self, reason: Optional[str] = None) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Reject({self.reason!r})"


class Retry:
    """``request_error`` action: re-issue the request in the same step."""

    kind = "retry"

    def __repr__(self) -> str:
        return "Retry()"


class Refuse:
    """Insert-transform result: refuse the message; the inserting call raises
    :class:`kerman.InsertRefusedError` naming the transform and ``reason``, and nothing is
    inserted."""

    kind = "refuse"
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        if not isinstance(reason, str) or not reason:
            raise TypeError(f"Refuse needs a reason (a non-empty str), got {reason!r}")
        self.reason = reason

    def __repr__(self) -> str:
        return f"Refuse({self.reason!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Refuse) and other.reason == self.reason

    def __hash__(self) -> int:
        return hash(("refuse", self.reason))


#: An inbox list: ``"next-turn"`` (prompts, one turn each) or ``"next-step"`` (steering, context).
Target = Literal["next-turn", "next-step"]

#: A ``pre_step`` decision.
Decision = Union[Enter, Reject]

_T_co = TypeVar("_T_co", covariant=True)


class Next(Protocol[_T_co]):
    """The ``next`` a waterfall listener gets: ``await next()`` runs the rest of the waterfall
    (the next remaining listener, finally the default) and gives back its result. Annotate a
    ``pre_step`` listener's as ``Next[Decision]``, a ``before_request`` one's as
    ``Next[ModelRequest]``, a ``request_error`` one's as ``Next[Optional[Retry]]``."""

    def __call__(self) -> Awaitable[_T_co]: ...


@dataclass
class PreStep:
    """The ``pre_step`` payload. ``messages`` is the claimed batch; the default decision enters
    it, so a listener that mutates it changes what the default returns."""

    loop: AgentLoop
    messages: List[UserMessage]
    turn: int
    step: int
    signal: Signal


@dataclass
class ModelRequest:
    """What the model is called with. ``messages`` is the derived history (user, assistant and
    tool-result messages in log order, this step's user messages included); ``entered`` the
    user messages entered in this step; ``instructions`` the system prompt (the loop's
    ``instructions``, or ``None``); ``output`` the structured output the turn's final reply must
    be (``{"name", "schema", "strict", "strict_schema"}``, from ``output_type=``; ``None``: text), which each
    provider sends with its own mechanism (docs/providers.md). ``before_request`` listeners may
    mutate ``options``, assign/mutate ``messages`` or assign ``instructions`` and ``output``."""

    messages: List[Any]
    tools: List[Dict[str, Any]]
    options: Dict[str, Any]
    turn: int
    step: int
    signal: Signal
    entered: List[UserMessage] = field(default_factory=list)
    loop: Optional[AgentLoop] = None
    instructions: Optional[str] = None
    output: Optional[Dict[str, Any]] = None


class ModelReply:
    """A complete model reply. ``content`` is a str (one text block) or a list of blocks;
    tool calls are ``{"type": "tool-call", "id", "name", "arguments"}`` blocks.

    ``failed_attempts``: the failed ``finish`` chunks (``{"type": "finish", "reason": "error",
    "error", "model"?, "provider"?}``) of requests the model made for this call before the one
    that answered (a non-streaming ``Fallback``'s models). The loop logs them before the reply,
    each a request of its own, as a stream's failed ``finish`` is."""

    __slots__ = ("content", "usage", "finish", "failed_attempts")

    def __init__(
        self,
        content: Union[str, List[Dict[str, Any]]],
        usage: Optional[Dict[str, Any]] = None,
        finish: str = "stop",
        *,
        failed_attempts: Sequence[Dict[str, Any]] = (),
    ) -> None:
        if finish not in ("stop", "max-tokens"):
            raise ValueError(f'finish must be "stop" or "max-tokens", got {finish!r}')
        if not isinstance(content, (str, list, tuple)):
            raise TypeError(f"ModelReply content must be a str or a list of blocks, got {type(content).__name__}")
        self.content = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        self.usage = usage
        self.finish = finish
        self.failed_attempts = list(failed_attempts)

    def __repr__(self) -> str:
        failed = f", failed_attempts={self.failed_attempts!r}" if self.failed_attempts else ""
        return f"ModelReply({self.content!r}, usage={self.usage!r}, finish={self.finish!r}{failed})"


@dataclass
class RequestFailure:
    """The ``request_error`` payload: ``failure`` is the failure dict (``message``, ``code``,
    optional ``status``, ``retryAfterMs``, ``requestId``); ``exception`` the ModelError, if any."""

    loop: AgentLoop
    turn: int
    step: int
    failure: Dict[str, Any]
    exception: Optional[BaseException]
    signal: Signal


@dataclass
class TurnStopping:
    """The ``turn_stopping`` payload. A listener that wants another step calls ``loop.steer``."""

    loop: AgentLoop
    turn: int
    signal: Signal


class LiveEvent:
    """A live (never persisted) loop event: ``.type``, ``.loop`` and its fields as attributes."""

    __slots__ = ("type", "loop", "_fields")

    def __init__(self, type: str, loop: AgentLoop, **fields: Any) -> None:
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "loop", loop)
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"{self.type} event has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("LiveEvent is frozen")

    def __dir__(self) -> List[str]:
        # The fields are served by __getattr__: list them, so dir() and completion (Jupyter,
        # IPython) show them.
        return sorted(set(object.__dir__(self)) | set(self._fields))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._fields.items())
        return f"LiveEvent({self.type!r}, {fields})"


#: ``async def f(step: PreStep, next: Next[Decision]) -> Decision`` (a plain function works too).
PreStepListener = Callable[[PreStep, Next[Decision]], Union[Decision, Awaitable[Decision]]]
#: ``async def f(request: ModelRequest, next: Next[ModelRequest]) -> ModelRequest``.
BeforeRequestListener = Callable[[ModelRequest, Next[ModelRequest]], Union[ModelRequest, Awaitable[ModelRequest]]]
#: ``async def f(failure: RequestFailure, next: Next[Optional[Retry]]) -> Optional[Retry]``.
RequestErrorListener = Callable[[RequestFailure, Next[Optional[Retry]]], Union[Optional[Retry], Awaitable[Optional[Retry]]]]
#: ``def f(message: UserMessage, target: str) -> UserMessage | Refuse``: sync, run before an
#: insertion's splice is committed (``loop.on_insert``, ``inbox.on_insert``).
InsertTransform = Callable[[UserMessage, Target], Union[UserMessage, Refuse]]
#: The model: called once per request, it returns an awaitable of a :class:`ModelReply` (or a
#: ``str``), or an async iterator of chunk dicts (``async def model(request)``, with or without
#: ``yield``; a plain function returning either works too).
Model = Callable[[ModelRequest], Union[Awaitable[Union[ModelReply, str]], AsyncIterator[Dict[str, Any]]]]
