"""``AgentLoop``: claims queued input before every step, awaits one pre-step decision, calls
the model, runs tools, and records everything in the session log.

The loop's rules live in the Rust core's turn machine (``src/agent_loop/``); its state is the
native ``LoopCore`` this object holds, and ``kerman._core.Driver`` (a native coroutine object, the
loop's Task) runs the machine. This module builds the loop (the core and its hooks: reporting,
the ``turn_stopping`` dispatch, the executor of a plan of several tool calls, handed to the core
as plain functions) and holds ``run()``; the rest of the public surface is in ``kerman._loop``,
one base class per responsibility: registration (``seams``), input (``delivery``), the driver,
cancellation and idling (``driver``), decisions and calls in doubt (``decisions``), what other
processes ask through the store (``remote``), and the shared state and properties (``state``).
"""

from __future__ import annotations

import asyncio
import enum
import threading
import weakref
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Dict,
    List,
    Literal,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
    overload,
)

from . import _busy, _continuation, _dispatch, _report, _run, output
from ._core import Inbox, LoopCore, MemoryStore, SessionLog, UserMessage
from ._loop.decisions import _Decisions
from ._loop.delivery import _Delivery
from ._loop.driver import TurnStillRunningWarning, _Driver
from ._loop.remote import _Remote
from ._loop.seams import _Seams
from ._loop.state import LIVE_EVENTS, _current_loop
from .compaction import Compactor
from .decisions import Approve, Ask, ToolCall
from .errors import LoopError
from .hooks import LiveEvent, Model
from .output import DEFAULT_OUTPUT_RETRIES, OutputSpec
from .signal import Signal
from .tools import Tool, _executor
from .usage._budget import Budget, priced_model

__all__ = ["AgentLoop", "TurnStillRunningWarning"]

# Defined with the driver that warns it; named where users import it from, as before the split.
TurnStillRunningWarning.__module__ = __name__


class ToolSource(Protocol):
    """What ``AgentLoop(tools=[...])`` and ``add_tools`` accept besides a ``Tool``: an object
    that registers its tools on a loop (``kerman.mcp.MCPServer``) and is closed with it."""

    def _kerman_attach(self, loop: AgentLoop) -> None: ...
    async def _kerman_detach(self, loop: AgentLoop) -> None: ...


# The AgentLoop over each log in this process (weakly, both ways): a new AgentLoop over the same
# log takes over from an idle one (a notebook cell that creates the loop running again).
_LOOPS: weakref.WeakKeyDictionary[SessionLog, weakref.ref[AgentLoop]] = weakref.WeakKeyDictionary()

_T = TypeVar("_T")


class _FromLog(enum.Enum):
    """The default of ``AgentLoop(instructions=)``: what the session last recorded."""

    TOKEN = 0


_FROM_LOG = _FromLog.TOKEN


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


class AgentLoop(_Delivery, _Remote, _Driver, _Decisions, _Seams):
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

        claimed_listeners = self._listeners["agent/inbox/claimed"]

        def claimed(message: UserMessage, turn: int) -> None:
            # The runs in flight learn their turns directly (no LiveEvent); the live event is
            # built only when someone else listens (kerman._run.Runs opens the gate).
            loop = this()
            if loop is None:
                return
            runs = loop._runs_in_flight
            if runs is None or not runs._listening:
                others = bool(claimed_listeners)
            else:
                runs.claimed(message.id, turn)
                others = len(claimed_listeners) > 1
            if others:
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
            on_claimed=claimed,
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

    if TYPE_CHECKING:

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
            ...

    else:
        # kerman._run.run is the method itself: a run awaits no second coroutine.
        run = _run.run

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
