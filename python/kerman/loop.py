"""``AgentLoop``: claims queued input before every step, awaits one pre-step decision, calls
the model, runs tools, and records everything in the session log.

The loop's rules live in the Rust core's turn machine (``src/agent_loop/``); its state is the
native ``LoopCore`` this object holds, and ``kerman._core.Driver`` (a native coroutine object, the
loop's Task) runs the machine. This module is the public surface: registration, delivery,
waking, cancellation and idling, plus the Python side of what the loop does (reporting, the
``turn_stopping`` dispatch, the executor of a plan of several tool calls), handed to the core as
plain functions.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import threading
import time
import warnings
import weakref
from typing import Any, Awaitable, Callable, Dict, List, Literal, Optional, Protocol, Sequence, Tuple, Type, TypeVar, Union, overload

from . import _busy, _continuation, _dispatch, _html, _report, _run, output
from . import compaction as _compaction
from ._core import NEXT_STEP, NEXT_TURN, Inbox, LoopCore, MemoryStore, SessionLog, Transcript, UserMessage
from .compaction import Compactor, Strategy
from .decisions import Approve, Ask, PendingDecision, ToolCall, outcome_of
from .errors import DecisionError, InboxError, LeaseLostError, LoopError
from .hooks import LiveEvent, Model
from .output import DEFAULT_OUTPUT_RETRIES, OutputSpec
from .signal import Signal
from .tools import Tool, ToolResult, _executor
from .usage._budget import Budget, priced_model

__all__ = ["AgentLoop", "TurnStillRunningWarning"]


class ToolSource(Protocol):
    """What ``AgentLoop(tools=[...])`` and ``add_tools`` accept besides a ``Tool``: an object
    that registers its tools on a loop (``kerman.mcp.MCPServer``) and is closed with it."""

    def _kerman_attach(self, loop: AgentLoop) -> None: ...
    async def _kerman_detach(self, loop: AgentLoop) -> None: ...


class TurnStillRunningWarning(RuntimeWarning):
    """``await loop.when_idle()`` was cancelled (an interrupted notebook cell, a timeout) while a
    turn was still running: the turn goes on in the background. ``loop.cancel()`` stops it;
    ``await loop.when_idle()`` waits for it again."""


# The AgentLoop over each log in this process (weakly, both ways): a new AgentLoop over the same
# log takes over from an idle one (a notebook cell that creates the loop running again).
_LOOPS: weakref.WeakKeyDictionary[SessionLog, weakref.ref[AgentLoop]] = weakref.WeakKeyDictionary()

Target = Literal["next-turn", "next-step"]
# A registered function: the registration methods return it unchanged, so a decorated
# listener keeps its own type under mypy --strict.
_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


class _FromLog(enum.Enum):
    """The default of ``AgentLoop(instructions=)``: what the session last recorded."""

    TOKEN = 0


_FROM_LOG = _FromLog.TOKEN
# The source of a str passed to inject(): context, not a human prompt ({"kind": "user"}).
_CONTEXT_SOURCE = {"kind": "context"}

LIVE_EVENTS = (
    "agent/status",
    "agent/inbox/inserted",
    "agent/inbox/claimed",
    "agent/inbox/discarded",
    "agent/error",
)


# How long a decision from another process waits for the AgentLoop it reached to be built.
_CONSTRUCTION_WAIT = 5.0


def _cause(cause: Union[str, Dict[str, Any]]) -> Dict[str, Any]:
    if isinstance(cause, str):
        if cause not in ("user", "parent", "disposed"):
            raise ValueError(f'cause must be "user", "parent", "disposed" or a dict, got {cause!r}')
        return {"kind": cause}
    if isinstance(cause, dict) and isinstance(cause.get("kind"), str):
        return dict(cause)
    raise ValueError(f'cause must be "user", "parent", "disposed" or a dict with a "kind", got {cause!r}')


async def _finished(task: asyncio.Task[Any]) -> None:
    """Waits for ``task`` to finish without raising its outcome and without cancelling it when
    the waiter is cancelled. ``asyncio.wait({task})`` does the same with more machinery and
    leaves callbacks behind for the next iteration; replacing it took 30-45% off the time a
    loop run one turn at a time spends outside a 50 ms model call (docs/performance.md)."""
    done = asyncio.get_running_loop().create_future()

    def wake(_: Any) -> None:
        if not done.done():
            done.set_result(None)

    task.add_done_callback(wake)
    try:
        await done
    finally:
        task.remove_done_callback(wake)


def _driver_finished(loop: AgentLoop) -> None:
    """The core's ``finished`` hook: the driver is done, the loop goes idle."""
    loop._task = None
    loop._finish_driver()


def _abort_signal(signal: Signal, cause: Dict[str, Any]) -> None:
    """The core's ``abort`` hook: the turn's signal aborts (an outside cancellation, a fence)."""
    signal._abort(cause)


def _default_gate(call: ToolCall) -> Union[Approve, Ask]:
    """The end of the ``before_tool`` waterfall: ask when the tool needs approval (``True``, or
    a predicate true of this call), else run."""
    tool = call.loop._tools.get(call.name)
    needs = tool.needs_approval if tool is not None else False
    if callable(needs):
        needs = needs(call)
    return Ask() if needs else Approve()


def _current_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class AgentLoop:
    """A durable agent loop over one session log.

    ``log=None`` uses a private memory log. Constructing over an existing log resumes it: the
    inbox is replayed and the turn counter restored; nothing runs until a wake.

    ``resume`` says what becomes of a last turn a crash interrupted: ``"close"`` (the default
    for a loop you build) leaves it closed as the store's closers closed it; ``"continue"``
    (what a ``Worker`` and ``kerman serve`` use unless the loop chose) answers its input: the
    next run begins with a continuation, a new turn that asks the model again over the history
    as logged, and input the turn claimed and never entered is requeued
    (docs/durability.md, "Crashed turns are answered").
    """

    def __init__(
        self,
        model: Model,
        log: Optional[SessionLog] = None,
        tools: Sequence[Union[Tool, ToolSource]] = (),
        max_parallel_tool_calls: int = 10,
        *,
        options: Optional[Dict[str, Any]] = None,
        instructions: Union[str, None, _FromLog] = _FROM_LOG,
        output_type: Any = None,
        output_retries: int = DEFAULT_OUTPUT_RETRIES,
        resume: Optional[Literal["continue", "close"]] = None,
        budget: Optional[Budget] = None,
        compaction: Optional[Compactor] = None,
        on_busy: _busy.OnBusy = "enqueue",
    ) -> None:
        # Whether (and how) the caller chose: a Worker or kerman serve adopts "continue" otherwise.
        self._resume_chosen = _continuation.check_resume(resume)
        if not callable(model):
            raise TypeError(f"model must be callable (async def model(request)), got {type(model).__name__}")
        if isinstance(max_parallel_tool_calls, bool) or not isinstance(max_parallel_tool_calls, int) or max_parallel_tool_calls < 1:
            raise ValueError(f"max_parallel_tool_calls must be an int >= 1, got {max_parallel_tool_calls!r}")
        if isinstance(output_retries, bool) or not isinstance(output_retries, int) or output_retries < 0:
            raise ValueError(f"output_retries must be an int >= 0, got {output_retries!r}")
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"budget must be a kerman.Budget or None, got {type(budget).__name__}")
        self._model = model
        self._budget = budget
        self._on_busy = _busy.checked(on_busy)
        # Structured output (kerman.output): the loop's type, each run's (by turn), the retries
        # spent per turn, the last validated value (turn, typed value) for run() to return.
        self._output_type: Optional[OutputSpec] = output.output_spec(output_type)
        self._output_retries = output_retries
        self._output_turns: Dict[int, OutputSpec] = {}
        self._output_attempts: Dict[int, int] = {}
        self._last_output: Optional[Tuple[int, Any]] = None
        self._runs_in_flight: Optional[_run.Runs] = None
        self._sync_loop: Optional[asyncio.AbstractEventLoop] = None
        self._owns_log = log is None
        self._log: SessionLog = log if log is not None else MemoryStore().create()
        self._successor: Optional[weakref.ref[AgentLoop]] = None
        if log is not None:
            self._take_over(log)
        self._max_parallel = max_parallel_tool_calls
        self._options: Dict[str, Any] = dict(options or {})
        self._listeners: Dict[str, List[Callable[..., Any]]] = {name: [] for name in LIVE_EVENTS}
        self._pre_step: List[Callable[..., Any]] = []
        self._before_request: List[Callable[..., Any]] = []
        self._request_error: List[Callable[..., Any]] = []
        self._turn_stopping: List[Callable[..., Any]] = []
        self._before_tool: List[Callable[..., Any]] = []
        self._before_compaction: List[Callable[..., Any]] = []
        self._compactor: Optional[Compactor] = None
        self._tools: Dict[str, Tool] = {}
        # Awaited before a step is taken up from the log (an MCP server lists its tools, so the
        # step's calls of them are known): `async def f() -> None`.
        self._resume_preparers: List[Callable[[], Awaitable[None]]] = []
        # Tool sources (kerman.mcp.MCPServer): their tools join _tools when a request needs
        # them; aclose() closes the sources.
        self._sources: List[ToolSource] = []
        for tool in tools:
            self._add_any(tool)
        # The inbox's callbacks reach the loop through a weak reference: a loop the program
        # drops is then freed at once, by reference counting, with whatever its session holds
        # (a 1 MB prompt, say), instead of waiting for a full garbage collection.
        this = weakref.ref(self)
        # Set once this constructor is done: a decision staged by another process may reach the
        # inbox (on the store's thread) while it still runs, and waits for it (_remote_decide).
        self._constructed = threading.Event()
        # Held while the status becomes "running" and while a result is recorded for a call in
        # doubt from the store's thread (_remote_resolve): a resumed step that runs a call again
        # and a result recorded for it by another process never both happen.
        self._settling = threading.Lock()

        def emit(event: str, **fields: Any) -> None:
            loop = this()
            if loop is not None:
                loop._emit(event, **fields)

        def claimed(message: UserMessage, turn: int) -> None:
            # The runs in flight learn their turns directly (no LiveEvent); the live event is
            # built only when someone else listens (kerman._run.Runs opens the gate).
            loop = this()
            if loop is not None and _run.claimed(loop, message, turn):
                loop._emit("agent/inbox/claimed", message=message, turn=turn)

        def remote_input(wake: bool) -> None:
            loop = this()
            if loop is not None:
                loop._remote_input(wake)

        def remote_cancel(cause: Any, keep_inbox: bool) -> Dict[str, Any]:
            loop = this()
            if loop is None:
                return {"applied": False, "op": "cancel", "reason": "no-loop", "detail": "the session's AgentLoop is gone"}
            return loop._remote_cancel(cause, keep_inbox)

        def remote_requeue(turn: int) -> Dict[str, Any]:
            loop = this()
            if loop is None:
                return {"applied": False, "op": "requeue", "reason": "no-loop", "detail": "the session's AgentLoop is gone"}
            return loop._remote_requeue(turn)

        def remote_decide(args: Dict[str, Any]) -> Dict[str, Any]:
            loop = this()
            if loop is None:
                return {"applied": False, "op": "decide", "reason": "no-loop", "detail": "the session's AgentLoop is gone"}
            return loop._remote_decide(args)

        def remote_resolve(args: Dict[str, Any]) -> Dict[str, Any]:
            loop = this()
            if loop is None:
                return {"applied": False, "op": "resolve", "reason": "no-loop", "detail": "the session's AgentLoop is gone"}
            return loop._remote_resolve(args)

        self._inbox = Inbox(
            self._log,
            on_inserted=lambda m: emit("agent/inbox/inserted", message=m),
            on_discarded=lambda m: emit("agent/inbox/discarded", message=m),
            on_claimed=lambda m, turn: claimed(m, turn),
            # Called only while someone listens: no Python call per message otherwise.
            _gates=(
                self._listeners["agent/inbox/inserted"],
                self._listeners["agent/inbox/discarded"],
                self._listeners["agent/inbox/claimed"],
            ),
            # PostgresStore.enqueue from another process: a waking message starts a turn.
            _on_remote=remote_input,
            # PostgresStore.cancel from another process, in order with the staged input.
            _on_remote_cancel=remote_cancel,
            # PostgresStore.requeue from another process (the web chat's resend), likewise.
            _on_remote_requeue=remote_requeue,
            # PostgresStore.decide from another process (a web handler), likewise.
            _on_remote_decide=remote_decide,
            # PostgresStore.resolve from another process (an operator), likewise.
            _on_remote_resolve=remote_resolve,
        )
        # The loop's state (turn counter, step, abort cause, wake latch, derived history) and
        # its rules are native; registration mutates the lists and dict handed over here.
        self._core = LoopCore(
            self._log,
            self._inbox,
            priced_model(model, budget) if budget is not None and budget.usd is not None else model,
            self._tools,
            self._pre_step,
            self._before_request,
            self._request_error,
            self._turn_stopping,
            self._options,
            max_parallel_tool_calls,
            describe=_report.describe,
            report_turn=_report.turn_failed,
            report_tool=_report.tool_failed,
            finished=_driver_finished,
            abort=_abort_signal,
            serial=_dispatch.serial,
            run_tools=_executor.run,
            before_tool=self._before_tool,
            default_gate=_default_gate,
        )
        if budget is not None:
            budget.install(self._core)
        self._regate()
        # Set by _continuation.apply: the first run requeues what an interrupted turn claimed.
        self._requeue_due = False
        _continuation.apply(self, self._resume_chosen or "close")
        if self._output_type is not None:
            self._install_output()
        if compaction is not None:
            self.compaction = compaction
        # Without instructions=, a resumed session goes on with the ones it last recorded.
        if instructions is not _FROM_LOG:
            self.instructions = instructions
        # A turn left waiting for decisions (this process or another): what expired meanwhile
        # is resolved now; the loop waits for the rest (or resumes at the next wake()).
        if self._core.next_expiry is not None:
            self._core.expire()
        self._status = "waiting" if self._core.waiting else "idle"
        self._expiry: Optional[asyncio.TimerHandle] = None
        # Whether the running driver began by resuming a decided step, and how many decisions
        # this loop had applied when it began (see _finish_driver).
        self._began_resumed = False
        self._decided = 0
        self._decided_at_start = 0
        self._task: Optional[asyncio.Task[None]] = None
        # Set by aclose(): no turn starts from then on (a wake scheduled by input inserted
        # meanwhile would run on a log about to close); the input stays pending, durable.
        self._closing = False
        self._event_loop: Optional[asyncio.AbstractEventLoop] = _current_loop()
        self._loop_thread: Optional[int] = threading.get_ident() if self._event_loop else None
        self._last_error: Optional[LiveEvent] = None
        _LOOPS[self._log] = weakref.ref(self)
        self._constructed.set()

    def _take_over(self, log: SessionLog) -> None:
        """An idle AgentLoop of this process over ``log`` gives way to this one (its inbox is
        closed; it refuses input from now on). One that is running a turn is not interrupted:
        this one is refused."""
        ref = _LOOPS.get(log)
        earlier = ref() if ref is not None else None
        if earlier is None or earlier._inbox.closed:
            return
        if earlier._status == "running":
            raise LoopError(
                f"session {log.id!r} already has an AgentLoop running turn {earlier.turn} in this process "
                f"({earlier!r}); stop it with its cancel() (or await its aclose()) before creating another"
            )
        earlier._inbox.close()
        earlier._disarm_expiry()  # the waiting turn, if any, is this loop's now
        earlier._successor = weakref.ref(self)
        earlier._owns_log = False  # the log is this loop's now: the earlier one's aclose() leaves it open

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
        from .usage import summary_line

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

    # ---- registration -----------------------------------------------------------------------

    def _decorator(self, listeners: List[Callable[..., Any]], fn: Optional[Callable[..., Any]], prepend: bool, where: str) -> Any:
        if fn is None:
            return lambda f: self._decorator(listeners, f, prepend, where)
        _dispatch.register(listeners, fn, prepend, where)
        return fn

    @overload
    def pre_step(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def pre_step(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def pre_step(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Waterfall before every step: ``async def f(step: PreStep, next) -> Enter | Reject``."""
        return self._decorator(self._pre_step, fn, prepend, "pre_step")

    @overload
    def before_request(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def before_request(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def before_request(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Waterfall before every model request: ``async def f(request, next) -> ModelRequest``."""
        return self._decorator(self._before_request, fn, prepend, "before_request")

    @overload
    def request_error(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def request_error(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def request_error(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Waterfall on a model failure: ``async def f(failure, next) -> Retry | None``."""
        return self._decorator(self._request_error, fn, prepend, "request_error")

    @overload
    def before_compaction(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def before_compaction(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def before_compaction(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Waterfall before every compaction: ``async def f(compaction: Compaction, next) ->
        Compaction | Veto``; ``await next()`` runs the strategy (docs/context.md)."""
        return self._decorator(self._before_compaction, fn, prepend, "before_compaction")

    @property
    def history(self) -> List[Any]:
        """The derived history the next request starts from (user, assistant and tool-result
        messages in log order, with every compaction applied), as a new list."""
        return list(self._core.history())

    @property
    def compaction(self) -> Optional[Compactor]:
        """The :class:`~kerman.compaction.Compactor` that compacts by itself (``None``: only
        ``await loop.compact(strategy)`` does)."""
        return self._compactor

    @compaction.setter
    def compaction(self, value: Optional[Compactor]) -> None:
        if value is not None and not isinstance(value, Compactor):
            raise TypeError(f"compaction must be a kerman.compaction.Compactor or None, got {value!r}")
        if self._compactor is not None:
            self._compactor._detach(self)
        self._compactor = value
        if value is not None:
            value._attach(self)

    async def compact(
        self,
        strategy: Optional[Strategy] = None,
        *,
        first: Optional[int] = None,
        last: Optional[int] = None,
        pin: Sequence[Any] = (),
    ) -> Optional[Any]:
        """Compacts the history now (docs/context.md, "Compaction"): ``strategy`` (default: the
        ``compaction`` Compactor's) replaces the oldest messages but its ``keep`` last, or the
        span ``first..last`` (seqs) when given; ``pin`` keeps messages verbatim. Returns the
        ``context/compacted`` record's view (``kerman.events.ContextCompacted``), or ``None``
        when there was nothing to compact or a ``before_compaction`` listener vetoed. A strategy
        that raises appends nothing."""
        self._check_fenced()
        if strategy is None:
            if self._compactor is None:
                raise ValueError("no strategy: pass one (loop.compact(SlidingWindow())) or set loop.compaction")
            strategy = self._compactor.strategy
        return await _compaction.compact(self, strategy, first=first, last=last, pin=pin)

    @overload
    def turn_stopping(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def turn_stopping(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def turn_stopping(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Serial, when a turn is about to end: ``async def f(stop: TurnStopping) -> None``."""
        return self._decorator(self._turn_stopping, fn, prepend, "turn_stopping")

    @overload
    def on_insert(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def on_insert(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def on_insert(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Registers an insert transform on the loop's inbox: ``def f(message: UserMessage,
        target: str) -> UserMessage | Refuse``, run (sync) on every new message before its
        splice is committed: ``followup``/``steer``/``inject``/``send``, the inbox's own
        mutations and tool contexts (docs/plugins.md)."""
        if fn is None:
            return lambda f: self.on_insert(f, prepend=prepend)
        return self._inbox.on_insert(fn, prepend=prepend)

    @overload
    def on(self, event: str, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def on(self, event: str, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def on(self, event: str, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Registers a live-event listener (sync or async; failures are logged)."""
        if event not in self._listeners:
            raise ValueError(f"unknown live event {event!r}; expected one of {', '.join(LIVE_EVENTS)}")
        return self._decorator(self._listeners[event], fn, prepend, repr(event))

    def remove_listener(self, fn: Callable[..., Any]) -> bool:
        """Removes ``fn`` from every seam it is registered on; False if it was nowhere."""
        found = False
        for listeners in [
            *self._listeners.values(),
            self._pre_step,
            self._before_request,
            self._request_error,
            self._turn_stopping,
            self._before_tool,
            self._before_compaction,
        ]:
            while fn in listeners:
                listeners.remove(fn)
                found = True
        self._regate()
        while self._inbox.remove_transform(fn):
            found = True
        return found

    @overload
    def before_tool(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def before_tool(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def before_tool(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Waterfall before every tool call runs: ``async def gate(call: ToolCall, next) ->
        Approve | Deny | Edit | Ask`` (``await next()`` gives the default: ``Ask()`` for a tool
        that needs approval, else ``Approve()``). A gate that raises or returns anything else
        keeps the call from running (``docs/decisions.md``)."""
        if fn is None:
            return lambda f: self.before_tool(f, prepend=prepend)
        out = self._decorator(self._before_tool, fn, prepend, "before_tool")
        self._regate()
        return out

    def _regate(self) -> None:
        """Calls are gated while a gate is registered or a tool needs approval."""
        self._core.gated = bool(self._before_tool) or any(t.needs_approval is not False for t in self._tools.values())

    @property
    def decisions(self) -> List[PendingDecision]:
        """The requests waiting for a person's decision, oldest first (a fold of the log: a
        loop that reopened the session lists what an earlier process left pending)."""
        return [PendingDecision(**d) for d in self._core.decisions()]

    def decide(self, decision_id: str, outcome: Any, *, by: Optional[str] = None, key: Optional[str] = None) -> bool:
        """Applies a person's decision (``Approve()``, ``Deny(reason)``, ``Edit(arguments)``,
        ``Answer(value)``) to pending request ``decision_id``: one ``decision/resolved`` is
        appended, and once every request of the step is decided the step goes on (the call
        runs, or gets its denial or answer as its result) without asking the model again.
        The same ``key`` again is applied once (returns False); an unknown, resolved or expired
        request raises :class:`kerman.DecisionError` naming why."""
        self._check_fenced()
        try:
            duplicate, ready = self._core.decide(decision_id, outcome, by, key)
            self._decided += 1
        except DecisionError:
            # An expired request was resolved as such: its step may go on all the same.
            self._resume_held()
            raise
        if ready:
            self._resume_held()
        return not duplicate

    @property
    def in_doubt(self) -> List[Dict[str, Any]]:
        """The calls in doubt of the last turn (their ``tool/call`` is logged, their result is
        not): ``{"call_id", "name", "seq", "policy"}`` each (``docs/durability.md``)."""
        return [dict(call_id=c, name=n, seq=s, policy=p) for c, n, s, p in self._core.in_doubt()]

    def resolve(self, call_id: str, result: Any) -> int:
        """Records ``result`` (a ``str``, or a ``ToolResult`` whose content is a ``str``; an
        error result when its ``is_error``) as the one result of call ``call_id`` in doubt;
        runs nothing. Once no call of the step is left for a resume to settle, the turn is
        closed as interrupted. Returns the result's seq; ``ValueError`` for a call not in
        doubt (it has its result, never started, or is not a call of the last turn)."""
        self._check_fenced()
        if isinstance(result, ToolResult):
            if not isinstance(result.content, str):
                raise TypeError("resolve() takes a ToolResult whose content is a str")
            text, is_error = result.content, result.is_error
        elif isinstance(result, str):
            text, is_error = result, False
        else:
            raise TypeError(f"resolve() takes a str or a ToolResult, got {type(result).__name__}")
        with self._settling:
            if self._status == "running":
                raise ValueError(
                    f"call {call_id!r} is not in doubt now: session {self._log.id!r} is running a step, "
                    f"which settles its calls by their policies"
                )
            seq = self._core.resolve(call_id, text, is_error)
        if self._status == "waiting" and not self._core.waiting:
            # The result answered the request the turn waited for, and closed the turn: the
            # loop is idle, and a loop that continues crashed turns continues this one.
            self._set_status("idle")
            if self._core.resumable and self._event_loop is not None and not self._closing:
                if self._on_loop_thread():
                    self._wake(False)
                else:
                    try:
                        self._call_on_loop(self._wake, False)
                    except LoopError:
                        pass  # its event loop is gone: the next owner's run continues the turn
        return int(seq)

    def _resume_held(self) -> None:
        """Takes up a waiting step that has something to do (on the bound event loop): its
        decisions are all in, or a call that needs none has no result yet."""
        if self._status != "waiting" or not self._core.resumable:
            return
        here = _current_loop()
        if self._event_loop is None:
            if here is None:
                self._set_status("idle")  # no event loop: the step resumes at the next wake()
                return
            self._bind(here)
        elif here is not self._event_loop:
            self._call_on_loop(self._resume_held)
            return
        self._disarm_expiry()
        self._start_driver()

    def _arm_expiry(self) -> None:
        """While waiting: a timer resolves requests as their deadlines pass."""
        self._disarm_expiry()
        deadline = self._core.next_expiry
        if deadline is None or self._event_loop is None or self._event_loop.is_closed():
            return
        delay = max(0.0, deadline / 1000 - time.time())
        self._expiry = self._event_loop.call_later(delay, self._expire_due)

    def _disarm_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _expire_due(self) -> None:
        self._expiry = None
        if self._status != "waiting" or self._log.closed or self._inbox.closed:
            return
        self._core.expire()
        if self._core.waiting:
            self._arm_expiry()
        else:
            self._resume_held()

    def tool(
        self,
        fn: Any = None,
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        parameters: Optional[Dict[str, Any]] = None,
        parallel: bool = True,
        needs_approval: Union[bool, Callable[[Any], bool]] = False,
        effect: str = "write",
        on_in_doubt: Union[str, Callable[..., Any]] = "fail",
    ) -> Any:
        """Registers a tool: ``@loop.tool``, ``@loop.tool(name=..., parallel=False)`` or
        ``loop.tool(Tool(...))``. Returns what it was given. A typed function
        (``async def search(query: str, limit: int = 10, *, ctx)``) gets its schema from its
        signature and its description from its docstring's first paragraph; a function of the
        ``(args, ctx)`` form gets the whole docstring (see :class:`Tool`)."""
        if isinstance(fn, Tool):
            self._add_tool(fn)
            return fn
        if fn is None:
            return lambda f: self.tool(
                f,
                name=name,
                description=description,
                parameters=parameters,
                parallel=parallel,
                needs_approval=needs_approval,
                effect=effect,
                on_in_doubt=on_in_doubt,
            )
        tool = Tool(
            name or fn.__name__,
            fn,
            description,
            parameters,
            parallel,
            needs_approval=needs_approval,
            effect=effect,
            on_in_doubt=on_in_doubt,
        )
        if description is None and not tool.typed:  # the (args, ctx) form: the whole docstring
            # cleandoc: Python 3.13 strips docstring indentation itself; every version gives the same text.
            tool.description = inspect.cleandoc(fn.__doc__ or "").strip()
        self._add_tool(tool)
        return fn

    def add_tools(self, *tools: Union[Tool, ToolSource]) -> None:
        """Registers tools: ``Tool`` objects, and tool sources such as a
        ``kerman.mcp.MCPServer`` (whose tools are listed when a model request first needs
        them, and whose connection ``aclose()`` closes)."""
        for tool in tools:
            self._add_any(tool)

    def _add_any(self, tool: Union[Tool, ToolSource]) -> None:
        attach = getattr(tool, "_kerman_attach", None)
        if attach is None or isinstance(tool, Tool):
            self._add_tool(tool)  # type: ignore[arg-type]
            return
        attach(self)
        self._sources.append(tool)

    def _add_tool(self, tool: Tool) -> None:
        if not isinstance(tool, Tool):
            raise TypeError(f"expected a kerman.Tool or a tool source (kerman.mcp.MCPServer), got {type(tool).__name__}")
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        if tool.needs_approval is not False and hasattr(self, "_core"):
            self._core.gated = True

    # ---- live events ------------------------------------------------------------------------

    def _emit(self, event: str, **fields: Any) -> None:
        if self._listeners[event]:
            self._emit_live(LiveEvent(event, self, **fields))

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

    # ---- delivery ---------------------------------------------------------------------------

    def followup(self, message: Union[str, UserMessage], *, on_busy: Optional[_busy.OnBusy] = None) -> UserMessage:
        """Queues a prompt for its own turn and wakes the loop. While a turn runs (or waits for
        decisions), ``on_busy`` (default: the loop's :attr:`on_busy`) says what happens:
        ``"enqueue"`` queues it after the turn, ``"reject"`` raises :class:`~kerman.BusyError`
        and queues nothing, ``"interrupt"`` cancels the turn (keeping what it logged) and runs
        the prompt next, ``"rollback"`` cancels the turn and the session goes on from before it
        (docs/context.md, "Double-texting")."""
        if on_busy is None and self._on_busy == "enqueue":
            return self.send(message, NEXT_TURN, True)
        return _busy.followup(self, message, on_busy)

    @property
    def on_busy(self) -> _busy.OnBusy:
        """What a followup does while a turn runs, unless it says otherwise: ``"enqueue"``,
        ``"reject"``, ``"interrupt"`` or ``"rollback"`` (``AgentLoop(on_busy=)``)."""
        return self._on_busy

    @on_busy.setter
    def on_busy(self, value: _busy.OnBusy) -> None:
        self._on_busy = _busy.checked(value)

    def steer(self, message: Union[str, UserMessage]) -> UserMessage:
        """Queues input for the nearest step boundary of the running turn, and wakes the loop."""
        return self.send(message, NEXT_STEP, True)

    def inject(self, message: Union[str, UserMessage]) -> UserMessage:
        """Queues context for the next step boundary without waking the loop. A ``str`` becomes a
        message with source ``{"kind": "context"}`` (not a human's: UIs show it as context, not
        steering); a ``UserMessage`` keeps its own source."""
        if isinstance(message, str):
            message = UserMessage(message, source=_CONTEXT_SOURCE)
        return self.send(message, NEXT_STEP, False)

    def send(self, message: Union[str, UserMessage], target: Target, wakeup: bool = True) -> UserMessage:
        """Inserts ``message`` at the end of ``target``; wakes the loop when ``wakeup``.

        Waking input sent while the running turn is being cancelled becomes a new turn
        (next-turn) and is replayed once the cancelled turn has ended.
        """
        if target not in (NEXT_TURN, NEXT_STEP):
            raise ValueError(f'target must be "next-turn" or "next-step", got {target!r}')
        # Every prompt passes here: the checks of _check_fenced and _wake are written out
        # rather than called (a Python call costs about as much as the native insertion).
        core = self._core
        if core.fenced is not None:
            self._check_fenced()
        # On the bound loop's own thread while it runs: no get_running_loop() (a getpid
        # syscall per call). Anywhere else, ask asyncio.
        bound = self._event_loop
        if bound is not None and self._loop_thread == threading.get_ident() and bound.is_running():
            here: Optional[asyncio.AbstractEventLoop] = bound
        else:
            here = _current_loop()
        on_thread = here is not None and here is bound
        if wakeup and not on_thread:
            if here is not None and self._event_loop is None:
                self._bind(here)
                on_thread = True
            elif here is not None and self._on_loop_thread():
                raise LoopError("this AgentLoop is bound to another event loop")
            elif self._event_loop is None:
                raise LoopError("AgentLoop cannot wake: no event loop is running (call from async code)")
            elif self._event_loop.is_closed():
                # Refused before inserting: a caller told of a failure must not find it queued.
                raise LoopError("the AgentLoop's event loop is closed; nothing was queued")
        after_abort = wakeup and self._status == "running" and core.aborted
        try:
            stored = self._inbox.append(NEXT_TURN if after_abort else target, message)
        except InboxError as e:
            if self._successor is not None:
                raise LoopError(
                    f"this AgentLoop over session {self._log.id!r} was replaced by a newer one "
                    f"({self._successor()!r}); send input to that one"
                ) from e
            raise
        if wakeup:
            if not on_thread:
                self._call_on_loop(self._wake, after_abort)
            elif self._status == "idle":  # read again: the insertion's listeners ran
                self._start_driver()
            elif after_abort:
                core.latch_wake(True)  # what _wake does for a loop that is not idle
        return stored

    def wake(self) -> bool:
        """Starts a turn if the loop is idle and input is pending (e.g. after a resume)."""
        self._check_fenced()
        if self._requeue_due and self._status == "idle":
            self._requeue_due = False
            _continuation.requeue_interrupted(self)
        if not self._inbox.has_pending and not (self._status in ("idle", "waiting") and self._core.resumable):
            return False
        here = _current_loop()
        if here is None or (self._event_loop is not None and not self._on_loop_thread()):
            # Not in async code, or on another thread (with an event loop of its own or not):
            # the wake is scheduled on the bound loop (SPEC 4.3).
            if self._event_loop is None:
                raise LoopError("AgentLoop cannot wake: no event loop is running (call from async code)")
            self._call_on_loop(self._wake, False)
            return True
        if self._event_loop is None:
            self._bind(here)
        elif here is not self._event_loop:
            raise LoopError("this AgentLoop is bound to another event loop")
        was_idle = self._status in ("idle", "waiting")
        self._wake(False)
        # False when no turn started after all: the log refused turn/start (reported as
        # agent/error), e.g. after a failed write poisoned it.
        return was_idle and self._status == "running"

    def _check_fenced(self) -> None:
        fenced = self._core.fenced
        if fenced is not None:
            raise LeaseLostError(
                f"this AgentLoop was fenced out of session {self._log.id!r} by a newer owner; reopen the session to continue ({fenced})"
            )

    def _remote_input(self, wake: bool) -> None:
        """Input another process enqueued was inserted (on the store's thread): wake as
        ``followup`` would. (getattr: this may run before ``__init__`` has finished.)"""
        if wake and getattr(self, "_event_loop", None) is not None:
            self._call_on_loop(self._wake_remote)

    def _wake_remote(self) -> None:
        # As followup: input arriving while the turn is being cancelled starts the next turn.
        self._wake(self._status == "running" and self._core.aborted)

    def _remote_cancel(self, cause: Any, keep_inbox: bool) -> Dict[str, Any]:
        """Another process asked to cancel (``PostgresStore.cancel``), on the store's thread, in
        order with the staged input around it: pending input is discarded here and now (input
        staged after the cancel is inserted after this), the running turn is aborted on the
        loop's event loop; a turn that started after this point is not touched."""
        try:
            reason = _cause(cause)
        except (TypeError, ValueError) as e:
            return {"applied": False, "op": "cancel", "reason": "invalid", "detail": str(e)}
        if self._core.fenced is not None:
            return {"applied": False, "op": "cancel", "reason": "fenced", "detail": "this owner was fenced out of the session"}
        discarded = [] if keep_inbox else [m.id for m in self._inbox.clear()]
        running = self._status == "running" and self._event_loop is not None
        turn = self.turn
        if running:
            self._call_on_loop(self._abort_remote, reason, turn)
        return {
            "applied": True,
            "op": "cancel",
            "cancelled": running,
            "turn": turn if running else None,
            "keep_inbox": keep_inbox,
            "discarded": discarded,
        }

    def _remote_requeue(self, turn: int) -> Dict[str, Any]:
        """Another process asked to send again what turn ``turn`` claimed and never read
        (``PostgresStore.requeue``), on the store's thread, in order with the staged input
        around it: requeued here and now, then the loop wakes (on its event loop) to run it.
        (getattr: staged input may be applied before ``__init__`` has finished.)"""
        core = getattr(self, "_core", None)
        if core is None:
            return {"applied": False, "op": "requeue", "reason": "no-loop", "detail": "the session's AgentLoop is not set up yet"}
        if core.fenced is not None:
            return {"applied": False, "op": "requeue", "reason": "fenced", "detail": "this owner was fenced out of the session"}
        try:
            requeued = self.requeue_claimed(turn)
        except LoopError as e:
            return {"applied": False, "op": "requeue", "reason": "nothing-to-requeue", "detail": str(e)}
        if getattr(self, "_event_loop", None) is not None:
            try:
                self._call_on_loop(self._wake_remote)
            except LoopError:
                pass  # its event loop is gone: the input stays pending, durable, for the next owner
        return {"applied": True, "op": "requeue", "turn": turn, "requeued": [m.id for m in requeued]}

    def _remote_decide(self, args: Dict[str, Any]) -> Dict[str, Any]:
        """Another process decided a pending request (``PostgresStore.decide``), on the store's
        thread, in order with the staged input around it: applied by :meth:`decide` here and
        now (the step resumes on the loop's event loop once every request of it is decided).
        A worker taking the session for this decision builds its loop while the staged rows are
        read: the decision waits (a few seconds at most) for the constructor to finish."""
        decision_id = args.get("decision_id")

        def refused(reason: str, detail: str) -> Dict[str, Any]:
            return {"applied": False, "op": "decide", "decision_id": decision_id, "reason": reason, "detail": detail}

        if not self._constructed.wait(_CONSTRUCTION_WAIT):
            return refused("no-loop", "the session's AgentLoop is not set up yet")
        try:
            outcome = outcome_of(args.get("outcome"))
            applied = self.decide(str(decision_id), outcome, by=args.get("by"), key=args.get("key"))
        except DecisionError as e:
            return refused(e.reason, str(e))
        except LeaseLostError:
            return refused("fenced", "this owner was fenced out of the session")
        except (TypeError, ValueError) as e:
            return refused("invalid", str(e))
        return {"applied": True, "op": "decide", "decision_id": decision_id, "duplicate": not applied}

    def _remote_resolve(self, args: Dict[str, Any]) -> Dict[str, Any]:
        """Another process recorded the result of a call in doubt (``PostgresStore.resolve``),
        on the store's thread, in order with the staged input around it: recorded by
        :meth:`resolve` here and now, or refused (``not-in-doubt``, with why) and the refusal
        sent back to the caller, which raises it."""
        call_id = args.get("call_id")

        def refused(reason: str, detail: str) -> Dict[str, Any]:
            return {"applied": False, "op": "resolve", "call_id": call_id, "reason": reason, "detail": detail}

        if not self._constructed.wait(_CONSTRUCTION_WAIT):
            return refused("no-loop", "the session's AgentLoop is not set up yet")
        result = ToolResult(str(args.get("text")), is_error=bool(args.get("is_error")))
        try:
            seq = self.resolve(str(call_id), result)
        except LeaseLostError:
            return refused("fenced", "this owner was fenced out of the session")
        except ValueError as e:
            return refused("not-in-doubt", str(e))
        return {"applied": True, "op": "resolve", "call_id": call_id, "seq": seq}

    def _abort_remote(self, reason: Dict[str, Any], turn: int) -> None:
        if self._status == "running" and self.turn == turn:
            self._cancel(reason, True)  # the inbox was cleared (or kept) when the cancel was applied

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

    # ---- the driver -------------------------------------------------------------------------

    def _wake(self, after_abort: bool) -> None:
        """Reference 5.3: start a driver when idle; latch a wake the running one cannot deliver."""
        if self._status == "waiting":
            # A reopened step's calls that need no decision run (input waits for the turn).
            self._resume_held()
            return
        if self._status != "idle":
            if after_abort:  # only input redirected by a cancel in progress can latch
                self._core.latch_wake(True)
            return
        self._start_driver()

    def _start_driver(self, abort: Optional[Dict[str, Any]] = None, prepared: bool = False) -> None:
        if self._closing:
            return
        if self._requeue_due:
            self._requeue_due = False
            _continuation.requeue_interrupted(self)
        if not prepared and self._resume_preparers and self._event_loop is not None and self._core.resumable:
            self._set_status("running")
            self._task = self._event_loop.create_task(self._prepare_resume(abort))
            return
        # The turn's signal exists before "running" is announced: a listener of that may cancel.
        self._core.prepare(Signal())
        if abort is not None:  # a held step cancelled while it waited: it resumes aborted
            self._core.abort(abort)
            self._core.signal._abort(abort)
        self._set_status("running")
        # begin appends turn/start and makes the first claim; None: no turn recorded.
        try:
            self._began_resumed = self._core.resumable
            self._decided_at_start = self._decided
            driver = self._core.begin(self)
        except BaseException:
            self._set_status("idle")  # nothing started: no driver will set it back
            raise
        if driver is None:
            self._finish_driver()
            return
        assert self._event_loop is not None
        # The driver (kerman._core.Driver) runs turns until one stops it, then calls
        # _driver_finished; an outside cancellation ends the turn disposed and propagates.
        self._task = self._event_loop.create_task(driver)

    async def _prepare_resume(self, abort: Optional[Dict[str, Any]]) -> None:
        for prepare in list(self._resume_preparers):
            try:
                await prepare()
            except Exception:
                # The step goes on: a call of a tool that is not registered gets its error result.
                logging.getLogger("kerman").exception("preparing to resume session %r failed", self._log.id)
        self._task = None
        self._start_driver(abort, prepared=True)

    def _finish_driver(self) -> None:
        latched = self._core.take_latch()
        if self._core.waiting:
            # The step stopped at its decisions; input queued meanwhile waits for the turn.
            self._set_status("waiting")
            self._arm_expiry()
            # A decision applied on another thread between the run's last read of the log and
            # the status change saw "running" and left the step to this method: read again. A
            # run that began by resuming the step and left it resumable with no decision since
            # (its log failed) is not started again here.
            if not self._began_resumed or self._decided != self._decided_at_start:
                self._resume_held()
            return
        if not self._began_resumed and self._core.fenced is None and self._core.resumable:
            # Every request was decided before the run that asked had even ended (the requests
            # are visible to other processes as soon as they are logged, and loop.decide, which
            # saw "running", left the step to this method): the step goes on now, still
            # "running". A run that began by resuming the step and left it resumable (its log
            # failed) is not started again here.
            self._start_driver()
            return
        self._set_status("idle")
        runs = self._runs_in_flight
        if runs is not None and runs.by_message:
            runs.idle()
        if latched and self._core.fenced is None and self._inbox.has_pending and self._status == "idle":
            self._start_driver()

    # ---- cancellation and idling ------------------------------------------------------------

    def cancel(self, cause: Union[str, Dict[str, Any]] = "user", *, keep_inbox: bool = False) -> None:
        """Aborts the running turn (first cause wins) and throws ``CancelledError`` into the
        listener, model or tool it awaits. Without ``keep_inbox`` pending input is discarded."""
        reason = _cause(cause)
        here = _current_loop()
        if self._event_loop is not None and here is not self._event_loop:
            self._call_on_loop(self._cancel, reason, keep_inbox)
            return
        self._cancel(reason, keep_inbox)

    def _cancel(self, reason: Dict[str, Any], keep_inbox: bool) -> None:
        failed: Optional[BaseException] = None
        if not keep_inbox:
            self._core.clear_latch()
            try:
                self._inbox.clear()
            except Exception as exc:
                # E.g. from a log observer, where appending is refused as reentrant: the turn
                # is still aborted; the caller learns that pending input was not discarded.
                failed = exc
        if self._status == "waiting" and reason.get("kind") != "disposed":
            # The pending requests are cancelled (logged); the step resumes aborted, so its
            # calls get their aborted results and the turn ends as a cancel ends it.
            self._core.cancel_decisions()
            self._disarm_expiry()
            if self._event_loop is not None and not self._event_loop.is_closed():
                self._start_driver(abort=reason)
            else:
                # No event loop: the step resumes at the next wake(), aborted (the core reads
                # the cancelled requests from the log).
                self._set_status("idle")
        elif self._status == "running" and self._core.abort(reason):
            self._core.signal._abort(reason)
            task = self._task
            # Throw into the listener, model or tool the driver awaits (once).
            if task is not None and not task.done() and self._core.should_throw():
                task.cancel()
        if failed is not None:
            raise failed

    async def when_idle(self) -> None:
        """Waits until no turn is running, following turns started at convergence. Never raises
        for a failed turn. Cancelling the wait (an interrupted notebook cell, a timeout) does not
        cancel the turn: it goes on, and a ``TurnStillRunningWarning`` says so and how to stop it."""
        while self._task is not None:
            task = self._task
            if not task.done():
                try:
                    await _finished(task)
                except asyncio.CancelledError:
                    if self._status == "running":
                        warnings.warn(
                            f"waiting for session {self._log.id!r} was cancelled, but its turn {self.turn} is "
                            f"still running in the background: loop.cancel() stops it, "
                            f"await loop.when_idle() waits for it again",
                            TurnStillRunningWarning,
                            stacklevel=2,
                        )
                    raise
            if self._task is task:
                break

    async def aclose(self, discard_pending: bool = False) -> None:
        """Cancels with cause ``disposed``, waits until idle, flushes, closes the log if this
        loop created it, and closes the loop's inbox, so another ``AgentLoop`` or ``Inbox`` may
        be created over the log. Pending input stays durable for the next resume unless
        ``discard_pending``."""
        self._closing = True
        self._disarm_expiry()  # a turn waiting for decisions stays waiting, in the log
        if self._status == "running" or discard_pending:
            self.cancel("disposed", keep_inbox=not discard_pending)
        await self.when_idle()
        try:
            if not self._log.closed and self._core.fenced is None:
                await self._log.flush()
                if self._owns_log:
                    await self._log.aclose()
        finally:
            # A log has at most one inbox: this loop's gives way to the next (a notebook
            # re-creating its loop over the same log).
            self._inbox.close()
            # Tool sources (MCP servers) stop once no turn can call them.
            for source in self._sources:
                await source._kerman_detach(self)

    async def __aenter__(self) -> AgentLoop:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        """``aclose()``: a log this loop created is closed; one it was given stays open, for
        whoever opened it (``with store.open(id) as log:``)."""
        await self.aclose()

    # ---- one call: run() ----------------------------------------------------------------------

    @property
    def output_type(self) -> Optional[OutputSpec]:
        """The structured output every turn's final reply must be (``output_type=``), or
        ``None`` (text); ``run(output_type=...)`` sets one for its own turn."""
        return self._output_type

    def _install_output(self) -> None:
        """The seams an output type works through (once): the request carries the schema
        (``before_request``, first), the final reply is validated (``turn_stopping``, last)."""
        if output.request_output not in self._before_request:
            self._before_request.insert(0, output.request_output)
            self._turn_stopping.append(output.validate_output)

    @property
    def _runs(self) -> _run.Runs:
        runs = self._runs_in_flight
        if runs is None:
            runs = self._runs_in_flight = _run.Runs(self)
        return runs

    @overload
    async def run(self, prompt: Union[str, UserMessage], *, output_type: Type[_T]) -> _run.RunResult[_T]: ...
    @overload
    async def run(self, prompt: Union[str, UserMessage], *, output_type: Optional[Dict[str, Any]] = None) -> _run.RunResult[Any]: ...
    async def run(self, prompt: Union[str, UserMessage], *, output_type: Any = None) -> _run.RunResult[Any]:
        """Sends ``prompt`` as a followup, waits for the turn that takes it (not merely the next
        idle: steering and other runs may go on meanwhile) and returns its
        :class:`~kerman.RunResult`. ``output_type`` (a pydantic model, dataclass, TypedDict or
        JSON-schema dict) is this turn's structured output, over the loop's ``output_type``.

        A turn that ends ``completed`` or ``max-tokens`` returns; any other ending raises
        :class:`~kerman.RunError` (failed, incl. ``INVALID_OUTPUT``; cancelled; rejected by a
        ``pre_step`` decision; a prompt discarded by ``cancel()`` before its turn). Cancelling
        the task that awaits ``run()`` withdraws the prompt, or cancels its turn if one took it."""
        return await _run.run(self, prompt, output_type)

    @overload
    def run_sync(self, prompt: Union[str, UserMessage], *, output_type: Type[_T]) -> _run.RunResult[_T]: ...
    @overload
    def run_sync(self, prompt: Union[str, UserMessage], *, output_type: Optional[Dict[str, Any]] = None) -> _run.RunResult[Any]: ...
    def run_sync(self, prompt: Union[str, UserMessage], *, output_type: Any = None) -> _run.RunResult[Any]:
        """``run()`` for scripts: blocks until the run's turn ends. Inside a running event loop
        (Jupyter, async code) it refuses: ``await loop.run(...)`` there. The loop's event loop is
        a private one made on first use (or the one the loop is bound to, when it runs in
        another thread)."""
        if _current_loop() is not None:
            raise LoopError("run_sync() cannot block inside a running event loop (Jupyter, async code): use `await loop.run(...)` instead")
        bound = self._event_loop
        if bound is not None and bound.is_running():
            return asyncio.run_coroutine_threadsafe(self.run(prompt, output_type=output_type), bound).result()
        if bound is not None and bound is not self._sync_loop:
            raise LoopError(
                f"this AgentLoop is bound to an event loop that is not running ({'closed' if bound.is_closed() else 'stopped'}); "
                "create the AgentLoop where you run it, or use `await loop.run(...)` in that event loop"
            )
        if self._sync_loop is None:
            self._sync_loop = asyncio.new_event_loop()
            weakref.finalize(self, self._sync_loop.close)
        return self._sync_loop.run_until_complete(self.run(prompt, output_type=output_type))

    def requeue_claimed(self, turn: int) -> List[UserMessage]:
        """Re-inserts what finished turn ``turn`` claimed but never entered (claimed input never
        comes back by itself; docs/loop.md, "Resume and requeue_claimed")."""
        return list(self._core.requeue_claimed(turn))
