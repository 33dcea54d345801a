"""Payloads, decisions and results exchanged between the AgentLoop and user code."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Literal, Mapping, Optional, Protocol, Sequence, TypeVar, Union

from ._core import UserMessage
from .errors import TurnAborted

if TYPE_CHECKING:
    from .loop import AgentLoop

__all__ = [
    "Signal",
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
    "ToolContext",
    "ToolResult",
    "Tool",
    "LiveEvent",
]

_log = logging.getLogger("kerman")


class Signal:
    """The abort signal of one turn, shared by every seam of that turn. First cause wins."""

    __slots__ = ("_reason", "_callbacks", "_waiters")

    def __init__(self) -> None:
        # The lists are made on first use: most turns' signals are never waited on.
        self._reason: Optional[Dict[str, Any]] = None
        self._callbacks: Optional[List[Callable[[Dict[str, Any]], object]]] = None
        self._waiters: Optional[List[asyncio.Future[None]]] = None

    @property
    def aborted(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> Optional[Dict[str, Any]]:
        """The cause dict given to the first ``cancel()``, or ``None``."""
        return None if self._reason is None else dict(self._reason)

    def add_callback(self, fn: Callable[[Dict[str, Any]], object]) -> None:
        """Calls ``fn(reason)`` when the signal aborts, or at once if it already has."""
        if self._reason is not None:
            fn(dict(self._reason))
        elif self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    async def wait(self) -> Dict[str, Any]:
        """Waits until the signal aborts; returns the reason."""
        if self._reason is None:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(fut)
            await fut
        assert self._reason is not None
        return dict(self._reason)

    def raise_if_aborted(self) -> None:
        """Raises :class:`kerman.TurnAborted` if the signal has aborted."""
        if self._reason is not None:
            raise TurnAborted(dict(self._reason))

    def _abort(self, reason: Dict[str, Any]) -> bool:
        if self._reason is not None:
            return False
        self._reason = dict(reason)
        callbacks, self._callbacks = self._callbacks or (), None
        for fn in callbacks:
            try:
                fn(dict(reason))
            except Exception:  # contained: one callback cannot stop the others
                _log.exception("signal callback %r raised", fn)
        waiters, self._waiters = self._waiters or (), None
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        return True

    def __repr__(self) -> str:
        return f"<Signal aborted={self._reason!r}>" if self._reason else "<Signal live>"


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
    ``instructions``, or ``None``). ``before_request`` listeners may mutate ``options``,
    assign/mutate ``messages`` or assign ``instructions``."""

    messages: List[Any]
    tools: List[Dict[str, Any]]
    options: Dict[str, Any]
    turn: int
    step: int
    signal: Signal
    entered: List[UserMessage] = field(default_factory=list)
    loop: Optional[AgentLoop] = None
    instructions: Optional[str] = None


class ModelReply:
    """A complete model reply. ``content`` is a str (one text block) or a list of blocks;
    tool calls are ``{"type": "tool-call", "id", "name", "arguments"}`` blocks."""

    __slots__ = ("content", "usage", "finish")

    def __init__(self, content: Union[str, List[Dict[str, Any]]], usage: Optional[Dict[str, Any]] = None,
                 finish: str = "stop") -> None:
        if finish not in ("stop", "max-tokens"):
            raise ValueError(f'finish must be "stop" or "max-tokens", got {finish!r}')
        if not isinstance(content, (str, list, tuple)):
            raise TypeError(f"ModelReply content must be a str or a list of blocks, got {type(content).__name__}")
        self.content = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        self.usage = usage
        self.finish = finish

    def __repr__(self) -> str:
        return f"ModelReply({self.content!r}, usage={self.usage!r}, finish={self.finish!r})"


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


@dataclass
class ToolContext:
    """What a tool body gets besides its arguments."""

    call_id: str
    turn: int
    step: int
    signal: Signal
    loop: AgentLoop


class ToolResult:
    """A tool's result. ``additional_contexts`` are queued in next-step right after the result
    is logged; ``concludes_turn`` lets the turn end without another model request."""

    __slots__ = ("content", "is_error", "concludes_turn", "additional_contexts", "meta")

    def __init__(self, content: Union[str, List[Dict[str, Any]]], is_error: bool = False,
                 concludes_turn: bool = False, additional_contexts: Sequence[Union[UserMessage, str]] = (),
                 meta: Any = None) -> None:
        if isinstance(additional_contexts, (str, bytes)):
            raise TypeError("additional_contexts must be a sequence of messages, not a str (wrap it in a list)")
        self.content = content
        self.is_error = is_error
        self.concludes_turn = concludes_turn
        self.additional_contexts = tuple(additional_contexts)
        self.meta = meta

    def __repr__(self) -> str:
        return f"ToolResult({self.content!r}, is_error={self.is_error}, concludes_turn={self.concludes_turn})"


class Tool:
    """A tool the model may call. ``parallel=False`` makes it a barrier: it runs alone.

    ``fn`` is either a **typed** function, whose parameters are the arguments
    (``async def search(query: str, limit: int = 10, *, ctx: ToolContext) -> str``): the JSON
    Schema is inferred from its signature and docstring, and each call's arguments are checked
    and converted before the body runs; or the **(args, ctx)** form,
    ``async def fn(args: dict, ctx: ToolContext) -> str | ToolResult``, which gets the arguments
    dict as it came. ``parameters``, when given, must be a JSON Schema with ``"type": "object"``
    (``ValueError`` otherwise); it replaces the inferred schema of a typed function.
    ``description=None`` is the docstring's first paragraph for a typed function, ``""`` for the
    (args, ctx) form (``AgentLoop.tool`` gives that form the whole docstring)."""

    __slots__ = ("name", "fn", "description", "parameters", "parallel", "_typed")

    def __init__(self, name: str, fn: Callable[..., Any], description: Optional[str] = None,
                 parameters: Optional[Mapping[str, Any]] = None, parallel: bool = True) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a tool name must be a non-empty str, got {name!r}")
        if not callable(fn):
            raise TypeError(f"tool {name!r}: fn must be callable")
        from .tools import _schema

        typed = _schema.typed_tool(name, fn)
        if parameters is not None:
            _schema.check_parameters(name, parameters, typed)
        self.name = name
        self.parallel = parallel
        self._typed = typed
        if typed is None:
            self.fn = fn
            self.description = description if description is not None else ""
            self.parameters = dict(parameters) if parameters is not None else {"type": "object", "properties": {}}
        else:
            # The loop calls fn(args, ctx): the adapter checks the arguments, then calls the
            # function with keywords (it is the adapter's __wrapped__).
            self.fn = typed.adapter
            self.description = description if description is not None else typed.description
            self.parameters = dict(parameters) if parameters is not None else typed.schema

    @property
    def typed(self) -> bool:
        """Whether ``fn`` is a typed function (its arguments checked before it runs)."""
        return self._typed is not None

    def spec(self) -> Dict[str, Any]:
        """The JSON spec a model sees. (The loop builds the same dict natively for a plain
        ``Tool``; a subclass that overrides ``spec`` is called.)"""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def __repr__(self) -> str:
        if self._typed is not None:
            return f"Tool({self.name!r}, typed({self._typed.shape()}), parallel={self.parallel})"
        return f"Tool({self.name!r}, parallel={self.parallel})"


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
