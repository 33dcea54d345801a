"""The state every part of ``AgentLoop`` shares: its attributes (declared once, for the type
checker), read-only properties and reprs, status changes, live events, the bound event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Literal, Optional, Tuple, TypeVar, Union, cast

from .. import _dispatch, _html
from .._core import Inbox, SessionLog, Transcript, UserMessage
from ..errors import LeaseLostError, LoopError
from ..hooks import LiveEvent
from ..signal import Signal
from ..tools import Tool
from ..usage._budget import Budget

if TYPE_CHECKING:
    import weakref

    from .. import _busy, _run
    from .._core import LoopCore
    from ..compaction import Compactor
    from ..hooks import Model
    from ..loop import AgentLoop, ToolSource
    from ..output import OutputSpec

Target = Literal["next-turn", "next-step"]
# A registered function: the registration methods return it unchanged, so a decorated
# listener keeps its own type under mypy --strict.
_F = TypeVar("_F", bound=Callable[..., Any])


LIVE_EVENTS = (
    "agent/status",
    "agent/inbox/inserted",
    "agent/inbox/claimed",
    "agent/inbox/discarded",
    "agent/error",
)


def _cause(cause: Union[str, Dict[str, Any]]) -> Dict[str, Any]:
    if isinstance(cause, str):
        if cause not in ("user", "parent", "disposed"):
            raise ValueError(f'cause must be "user", "parent", "disposed" or a dict, got {cause!r}')
        return {"kind": cause}
    if isinstance(cause, dict) and isinstance(cause.get("kind"), str):
        return dict(cause)
    raise ValueError(f'cause must be "user", "parent", "disposed" or a dict with a "kind", got {cause!r}')


def _current_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _LoopState:
    """The base of every part of ``AgentLoop``: the attributes ``AgentLoop.__init__`` sets, and
    what one part calls of another, declared for the type checker only."""

    _resume_chosen: Optional[str]
    _model: Model
    _budget: Optional[Budget]
    _on_busy: _busy.OnBusy
    # Structured output (kerman.output): the loop's type, each run's (by turn), the retries
    # spent per turn, the last validated value (turn, typed value) for run() to return.
    _output_type: Optional[OutputSpec]
    _output_retries: int
    _output_turns: Dict[int, OutputSpec]
    _output_attempts: Dict[int, int]
    _last_output: Optional[Tuple[int, Any]]
    _runs_in_flight: Optional[_run.Runs]
    _sync_loop: Optional[asyncio.AbstractEventLoop]
    _owns_log: bool
    _log: SessionLog
    _successor: Optional[weakref.ref[AgentLoop]]
    _max_parallel: int
    _options: Dict[str, Any]
    _listeners: Dict[str, List[Callable[..., Any]]]
    _pre_step: List[Callable[..., Any]]
    _before_request: List[Callable[..., Any]]
    _request_error: List[Callable[..., Any]]
    _turn_stopping: List[Callable[..., Any]]
    _before_tool: List[Callable[..., Any]]
    _before_compaction: List[Callable[..., Any]]
    _compactor: Optional[Compactor]
    _tools: Dict[str, Tool]
    _resume_preparers: List[Callable[[], Awaitable[None]]]
    _sources: List[ToolSource]
    _constructed: threading.Event
    _settling: threading.Lock
    _inbox: Inbox
    _core: LoopCore
    _requeue_due: bool
    _status: str
    _expiry: Optional[asyncio.TimerHandle]
    _began_resumed: bool
    _decided: int
    _decided_at_start: int
    _task: Optional[asyncio.Task[None]]
    _closing: bool
    _event_loop: Optional[asyncio.AbstractEventLoop]
    _loop_thread: Optional[int]
    _last_error: Optional[LiveEvent]

    if TYPE_CHECKING:
        # Defined by the other parts (driver, decisions, seams, AgentLoop itself).
        def _wake(self, after_abort: bool) -> None: ...
        def _start_driver(self, abort: Optional[Dict[str, Any]] = None, prepared: bool = False) -> None: ...
        def _finish_driver(self) -> None: ...
        def _cancel(self, reason: Dict[str, Any], keep_inbox: bool) -> None: ...
        def _resume_held(self) -> None: ...
        def _arm_expiry(self) -> None: ...
        def _disarm_expiry(self) -> None: ...
        def _regate(self) -> None: ...
        def _add_tool(self, tool: Tool) -> None: ...
        def decide(self, decision_id: str, outcome: Any, *, by: Optional[str] = None, key: Optional[str] = None) -> bool: ...
        def resolve(self, call_id: str, result: Any) -> int: ...
        def requeue_claimed(self, turn: int) -> List[UserMessage]: ...

    # ---- properties -------------------------------------------------------------------------

    @property
    def inbox(self) -> Inbox:
        return self._inbox

    @property
    def log(self) -> SessionLog:
        return self._log

    @property
    def budget(self) -> Optional[Budget]:
        """The loop's budget (``AgentLoop(budget=kerman.Budget(...))``), or ``None``."""
        return self._budget

    def spent(self) -> Dict[str, Any]:
        """What the log shows spent, as a budget counts it (docs/usage.md#budgets):
        ``{"turn": n, "thisTurn": {...}, "session": {...}}``, each with ``tokens``,
        ``requests``, ``toolCalls``, ``costUsd`` and ``unpriced``."""
        spent: Dict[str, Any] = self._core.spent()
        return spent

    @property
    def instructions(self) -> Optional[str]:
        """The system prompt each request starts with (``request.instructions``), or ``None``.
        Recorded in the log (``agent/instructions``) before the next request when it changes, so
        an ``AgentLoop`` resumed over the session without ``instructions=`` sends the same."""
        return self._core.instructions

    @instructions.setter
    def instructions(self, value: Optional[str]) -> None:
        if value is not None and not isinstance(value, str):
            raise TypeError(f"instructions must be a str or None, got {type(value).__name__}")
        self._core.instructions = value

    @property
    def resume(self) -> str:
        """``"continue"`` or ``"close"``: what becomes of a last turn a crash interrupted (see the
        class; a ``Worker`` or ``kerman serve`` sets ``"continue"`` unless the loop chose)."""
        return "continue" if self._core.continue_crashes else "close"

    @property
    def status(self) -> str:
        """``"idle"``, ``"running"``, or ``"waiting"``: the turn's step waits for decisions
        (``loop.decisions``); its calls that need no decision have run, and the rest waits for
        ``loop.decide`` (or ``cancel()``)."""
        return self._status

    @property
    def turn(self) -> int:
        """The number of the last turn started (0 before the first)."""
        return self._core.turn

    @property
    def step(self) -> int:
        """The last step entered in the running (or last) turn (0 before its first)."""
        return self._core.step

    @property
    def closed(self) -> bool:
        """Whether the loop takes no more input: ``aclose()`` ran, or a newer ``AgentLoop`` over
        its log took over."""
        return self._inbox.closed

    def transcript(self) -> Transcript:
        """The session's conversation so far (``log.transcript()``)."""
        return self._log.transcript()

    @property
    def _signal(self) -> Signal:
        """The running (or last) turn's signal; a fresh one before the first turn."""
        signal = self._core.signal
        return signal if signal is not None else Signal()

    @property
    def _fenced(self) -> Optional[BaseException]:
        """The ``LeaseLostError`` of another owner taking the session over (PostgresStore): the
        loop stops."""
        return self._core.fenced

    @property
    def _in_user(self) -> bool:
        return self._core.in_user

    @property
    def _thrown(self) -> bool:
        return self._core.thrown

    @property
    def tools(self) -> Dict[str, Tool]:
        return dict(self._tools)

    @property
    def last_error(self) -> Optional[LiveEvent]:
        """The last ``agent/error`` event (``.error``, ``.exception``, ``.traceback``,
        ``.function``, ``.turn``, ``.step``), whether or not anyone listened; ``None`` if
        nothing failed yet."""
        return self._last_error

    def __repr__(self) -> str:
        tools = ", ".join(repr(name) for name in self._tools)
        listeners = sum(self._listener_counts().values())
        closed = " closed" if self._inbox.closed else ""
        on_busy = f" on_busy={self._on_busy!r}" if self._on_busy != "enqueue" else ""
        return (
            f"<AgentLoop turn={self._core.turn} status={self._status} pending={len(self._inbox)} step={self._core.step} "
            f"session={self._log.id!r} tools=[{tools}] listeners={listeners}{on_busy}{closed}>"
        )

    def _repr_html_(self) -> str:
        from ..usage import summary_line

        return _html.agent_loop(self, usage=summary_line(self))

    def _listener_counts(self) -> Dict[str, int]:
        """How many listeners each seam and live event has (for the reprs)."""
        counts = {
            "pre_step": len(self._pre_step),
            "before_request": len(self._before_request),
            "before_compaction": len(self._before_compaction),
            "request_error": len(self._request_error),
            "turn_stopping": len(self._turn_stopping),
        }
        counts.update((name, len(fns)) for name, fns in self._listeners.items())
        return counts

    # ---- live events ------------------------------------------------------------------------

    def _emit(self, event: str, **fields: Any) -> None:
        if self._listeners[event]:
            self._emit_live(LiveEvent(event, cast("AgentLoop", self), **fields))

    def _emit_live(self, live: LiveEvent) -> None:
        event = live.type
        listeners = self._listeners[event]
        if not listeners:
            return
        # Listeners run on the bound loop's thread (SPEC 4.3), even for an insertion made
        # from another thread.
        if self._event_loop is not None and threading.get_ident() != self._loop_thread:
            self._event_loop.call_soon_threadsafe(_dispatch.emit, listeners, live, event)
        else:
            _dispatch.emit(listeners, live, event)

    def _set_status(self, status: str) -> None:
        if status != self._status:
            with self._settling:
                self._status = status
            self._emit("agent/status", status=status)

    def _check_fenced(self) -> None:
        fenced = self._core.fenced
        if fenced is not None:
            raise LeaseLostError(
                f"this AgentLoop was fenced out of session {self._log.id!r} by a newer owner; reopen the session to continue ({fenced})"
            )

    def _on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def _bind(self, event_loop: asyncio.AbstractEventLoop) -> None:
        self._event_loop = event_loop
        self._loop_thread = threading.get_ident()

    def _call_on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._event_loop is not None
        try:
            self._event_loop.call_soon_threadsafe(fn, *args)
        except RuntimeError as e:  # the loop is closed
            raise LoopError(f"the AgentLoop's event loop is not running: {e}") from e
