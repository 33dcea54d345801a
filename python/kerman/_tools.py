"""Tool scheduling (reference 5.8, SPEC 4.4): calls start in model order in a rolling pool of
at most ``max_parallel_tool_calls`` (a ``parallel=False`` tool is a barrier and runs alone);
results are logged strictly in model order; after an abort nothing new starts, started calls
are cancelled and drain, and unstarted ones get a synthetic aborted result."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import sys
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Coroutine, Dict, Generator, List, Optional, Tuple

from ._core import NEXT_STEP, ToolResultMessage, UserMessage
from ._report import callable_name, describe, tool_failed
from ._turn import _uncancel
from .types import Tool, ToolContext, ToolResult

if TYPE_CHECKING:
    from .loop import AgentLoop

# (content, is_error, error dict or None, concludes_turn, additional contexts, meta, the
# exception the body raised or None)
Outcome = Tuple[Any, bool, Optional[Dict[str, Any]], bool, Tuple[Any, ...], Any, Optional[BaseException]]


def _error(text: str, name: str, code: str, exc: Optional[BaseException] = None) -> Outcome:
    return text, True, {"name": name, "code": code}, False, (), None, exc


ABORTED_BEFORE = ("Error: tool call aborted before dispatch", "AbortError", "ABORTED_BEFORE_DISPATCH")
ABORTED_DURING = ("Error: tool call aborted during dispatch", "CancelledError", "ABORTED_DURING_DISPATCH")


async def _invoke(loop: "AgentLoop", tool: Tool, call: Dict[str, Any], ctx: ToolContext,
                  box: List[Optional[Outcome]]) -> Outcome:
    """Runs one tool body. The outcome is also left in ``box``: a tool that calls
    ``loop.cancel()`` and then returns finishes in a task asyncio marks cancelled, and its
    result must still be committed (SPEC 4.4)."""
    box[0] = outcome = await _invoke_body(loop, tool, call, ctx)
    return outcome


async def _invoke_body(loop: "AgentLoop", tool: Tool, call: Dict[str, Any], ctx: ToolContext) -> Outcome:
    try:
        if loop._log._checkpoints:
            await loop._log.flush()
    except asyncio.CancelledError:
        return _error(*ABORTED_BEFORE)
    if ctx.signal._reason is not None:  # the slot, not the property: this runs per call
        return _error(*ABORTED_BEFORE)
    try:
        raw = call.get("arguments") or "{}"
        args = _decode_arguments(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        return _bad_arguments(exc)
    try:
        value = tool.fn(args, ctx)
        if type(value) is CoroutineType or inspect.isawaitable(value):
            value = await value
    except asyncio.CancelledError:
        return _error(*ABORTED_DURING)
    except Exception as exc:
        return _raised(exc)
    return _returned(tool, value)


# The outcomes of a body, shared with the driver's own run of a lone call (kerman._core.Driver,
# src/python/driver/tool.rs), which calls these for everything but a plain str result.

def _aborted_before() -> Outcome:
    return _error(*ABORTED_BEFORE)


def _bad_arguments(exc: ValueError) -> Outcome:
    return _error(f"invalid tool arguments: {exc}", "ValueError", "INVALID_ARGUMENTS")


def _raised(exc: BaseException) -> Outcome:
    """A body's exception: its CancelledError is an aborted dispatch, any other an error result."""
    if isinstance(exc, asyncio.CancelledError):
        return _error(*ABORTED_DURING)
    return _error(str(exc) or type(exc).__name__, type(exc).__name__, "TOOL_ERROR", exc)


def _returned(tool: Tool, value: Any) -> Outcome:
    if isinstance(value, str):
        return value, False, None, False, (), None, None
    if not isinstance(value, ToolResult):
        return _error(f"tool {tool.name!r} returned {type(value).__name__}; expected str or ToolResult",
                      "TypeError", "TOOL_ERROR")
    return value.content, value.is_error, None, value.concludes_turn, value.additional_contexts, value.meta, None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# One decoder for every call: json.loads with a keyword builds a new decoder (and scanner) each time.
_ARGUMENTS = json.JSONDecoder(parse_constant=_reject_constant)


def _decode_arguments(text: str) -> Any:
    """The arguments' JSON text as Python values; ``ValueError`` for anything that is not JSON
    the tool can receive. Valid JSON nested deeper than the interpreter can decode (its
    recursion limit) is such a value: an ``INVALID_ARGUMENTS`` result, never a failed turn."""
    try:
        return _ARGUMENTS.decode(text)
    except RecursionError:
        raise ValueError(f"nested too deeply to decode ({len(text)} characters; Python's recursion "
                         f"limit is {sys.getrecursionlimit()})") from None


def _record(loop: "AgentLoop", turn: int, step: int, call: Dict[str, Any], call_seq: int, outcome: Outcome) -> None:
    content, is_error, error, _, _, meta, raised = outcome
    if raised is not None and error is not None:
        tool = loop._tools.get(call.get("name"))  # type: ignore[arg-type]
        error = {**error, **describe(raised, callable_name(tool.fn) if tool is not None else None, typed=False)}
    message = ToolResultMessage(call["id"], content, is_error=is_error)
    # The message object itself: _append_owned writes it as its JSON (no dict round trip).
    data: Dict[str, Any] = {"turn": turn, "step": step, "message": message}
    if error is not None:
        data["error"] = error
    if meta is not None:
        data["meta"] = meta
    # The history takes the message as is (a gap before it is decoded by the driver).
    loop._history.remember(loop._log._append_owned("tool/result", data, [call_seq]).seq, message)
    if raised is not None and error is not None:
        tool_failed(loop, turn, step, call, error, content, raised)


def _commit(loop: "AgentLoop", turn: int, step: int, call: Dict[str, Any], call_seq: int, outcome: Outcome) -> bool:
    _, _, _, concludes, contexts, _, _ = outcome
    try:
        _record(loop, turn, step, call, call_seq, outcome)
    except ValueError as exc:  # InvalidMessageError, NotJsonError: a result that is not JSON
        # Like any other bad return value, an error result; the call keeps its result.
        invalid = _error(f"tool {call.get('name')!r} returned an invalid result: {exc}", type(exc).__name__, "TOOL_ERROR")
        _record(loop, turn, step, call, call_seq, invalid)
        return False
    for context in contexts:
        if isinstance(context, str):
            context = UserMessage(context, source={"kind": "plugin", "plugin": f"tool:{call.get('name')}"})
        loop._inbox.append(NEXT_STEP, context)
    return concludes


def _log_call(loop: "AgentLoop", turn: int, step: int, call: Dict[str, Any]) -> int:
    data = {"turn": turn, "step": step, "callId": call["id"], "name": call["name"], "arguments": call.get("arguments", "")}
    seq = int(loop._log._append_owned("tool/call", data).seq)
    loop._history.remember(seq)
    return seq


def run_tools(loop: "AgentLoop", turn: int, step: int, calls: List[Dict[str, Any]]) -> Coroutine[Any, Any, bool]:
    """The coroutine that runs the step's tool calls and returns whether a committed result
    concludes the turn (a plain function choosing it, so a lone call is one coroutine deep)."""
    if len(calls) == 1 and _INLINE and loop._signal._reason is None:
        tool = loop._tools.get(calls[0].get("name", ""))
        if tool is not None:
            return _run_inline(loop, turn, step, calls[0], tool)
    return _run_pool(loop, turn, step, calls)


async def _run_pool(loop: "AgentLoop", turn: int, step: int, calls: List[Dict[str, Any]]) -> bool:
    signal = loop._signal
    n = len(calls)
    outcomes: List[Optional[Outcome]] = [None] * n
    boxes: Dict[int, List[Optional[Outcome]]] = {}
    call_seqs: List[int] = [0] * n
    running: Dict[int, "asyncio.Task[Outcome]"] = {}
    exclusive_running = False
    committed = 0
    concludes = False

    def cancel_running(_reason: Any = None) -> None:
        for task in running.values():
            task.cancel()

    signal.add_callback(cancel_running)

    def commit_ready() -> None:
        nonlocal committed, concludes
        while committed < n and outcomes[committed] is not None:
            outcome = outcomes[committed]
            assert outcome is not None
            concludes = _commit(loop, turn, step, calls[committed], call_seqs[committed], outcome) or concludes
            committed += 1

    def collect(done: Any) -> None:
        nonlocal exclusive_running
        failed: Optional[BaseException] = None
        for index in [i for i, t in running.items() if t in done]:
            task = running.pop(index)
            if task.cancelled():
                outcomes[index] = boxes[index][0] or _error(*ABORTED_DURING)
            elif task.exception() is not None:
                # Only the checkpoint barrier before the body raises (the body's own exceptions
                # become error results). Every finished call is looked at before failing the step.
                failed = failed or task.exception()
            else:
                outcomes[index] = task.result()
        exclusive_running = exclusive_running and bool(running)
        if failed is not None:
            raise failed
        commit_ready()

    async def wait_any() -> None:
        done, _ = await asyncio.wait(running.values(), return_when=asyncio.FIRST_COMPLETED)
        collect(done)

    started = 0
    try:
        while started < n and not signal.aborted:
            call = calls[started]
            tool = loop._tools.get(call.get("name", ""))
            exclusive = tool is not None and not tool.parallel
            while running and (exclusive or exclusive_running or len(running) >= loop._max_parallel):
                await wait_any()
            if signal.aborted:
                break
            call_seqs[started] = _log_call(loop, turn, step, call)
            if tool is None:
                outcomes[started] = _error(f"unknown tool {call.get('name')!r}", "UnknownToolError", "UNKNOWN_TOOL")
            else:
                ctx = ToolContext(call["id"], turn, step, signal, loop)
                boxes[started] = [None]
                running[started] = asyncio.ensure_future(_invoke(loop, tool, call, ctx, boxes[started]))
                exclusive_running = exclusive
            started += 1
            commit_ready()
        while running:
            await wait_any()
    except asyncio.CancelledError:
        # The driver itself is being cancelled from outside: started calls are cancelled,
        # drain and commit all the same, so the log never holds a call without its result.
        cancel_running()
        if running:
            done, _ = await asyncio.shield(asyncio.wait(list(running.values())))
            collect(done)
        _abort_unstarted(loop, turn, step, calls, started, call_seqs, outcomes)
        commit_ready()
        raise
    except Exception:
        # The step failed (a checkpoint barrier or an append raised LogWriteError, a result
        # was unusable): no call may outlive its step, so the running ones are cancelled and
        # drained. Their outcomes are dropped: the log is usually poisoned by then.
        cancel_running()
        if running:
            await asyncio.shield(asyncio.wait(list(running.values())))
            for task in running.values():
                if not task.cancelled():
                    task.exception()  # retrieved, so asyncio does not report it as lost
        raise
    _abort_unstarted(loop, turn, step, calls, started, call_seqs, outcomes)
    commit_ready()
    return concludes


# A lone call has nothing to run beside it, so it runs in the driver's own task instead of a
# task of its own: no task, no asyncio.wait, no extra event-loop iterations. cancel() reaches it
# the way it reaches a listener or the model (``_in_user``). Telling an outside cancellation
# from the tool's own CancelledError needs ``Task.cancelling()`` (3.11+); 3.10 uses the pool.
# The Rust driver runs most lone calls itself (src/python/driver/tool.rs, the same steps);
# ``_run_inline`` is left the ones with a checkpoint barrier to await before the body.
_INLINE = sys.version_info >= (3, 11)


class _InContext:
    """Awaits ``coro`` with every step of it run inside ``context``: what a task of its own
    would give the call (a copy of the driver's context variables, so a tool that sets one
    does not leak it into the rest of the turn, exactly as a pooled call cannot)."""

    __slots__ = ("coro", "context")

    def __init__(self, coro: Any, context: contextvars.Context) -> None:
        self.coro = coro
        self.context = context

    def __await__(self) -> Generator[Any, Any, Any]:
        run, coro = self.context.run, self.coro
        value: Any = None
        error: Optional[BaseException] = None
        while True:
            try:
                yielded = run(coro.send, value) if error is None else run(coro.throw, error)
            except StopIteration as stop:
                return stop.value
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                run(coro.close)
                raise
            except BaseException as exc:
                value, error = None, exc


async def _run_inline(loop: "AgentLoop", turn: int, step: int, call: Dict[str, Any], tool: Tool) -> bool:
    call_seq = _log_call(loop, turn, step, call)
    ctx = ToolContext(call["id"], turn, step, loop._signal, loop)
    loop._in_user = True
    try:
        outcome = await _InContext(_invoke_body(loop, tool, call, ctx), contextvars.copy_context())
    finally:
        loop._in_user = False
    task = loop._task  # the driver's task, which this runs in (no current_task() lookup)
    external = False
    if loop._thrown:
        # cancel() threw into the call, or the call cancelled and returned before the throw
        # landed: absorb it here, as the driver does after a listener.
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass
        _uncancel(loop)
    elif task is not None and task.cancelling():
        # Cancelled from outside while the call ran: its result is committed all the same
        # (the log never holds a call without its result), then the cancellation goes on.
        external = True
    concludes = _commit(loop, turn, step, call, call_seq, outcome)
    if external:
        raise asyncio.CancelledError()
    return concludes


def _abort_unstarted(loop: "AgentLoop", turn: int, step: int, calls: List[Dict[str, Any]], started: int,
                     call_seqs: List[int], outcomes: List[Optional[Outcome]]) -> None:
    for index in range(started, len(calls)):
        call_seqs[index] = _log_call(loop, turn, step, calls[index])
        outcomes[index] = _error(*ABORTED_BEFORE)
