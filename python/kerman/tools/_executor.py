"""The executor of a plan of several tool calls (reference 5.8, SPEC 4.4).

The Rust core's tool plan decides which call starts next, commits results in model order and
synthesises what never ran; this module only awaits: each call's body runs in an asyncio task of
its own (so each gets a copy of the context variables), the running ones are cancelled when the
turn's signal aborts, and all of them drain before the step ends. A plan of one call is awaited
by the driver itself and never comes here.

Whatever a body raises, its call gets its result. A ``KeyboardInterrupt`` (or another
``BaseException`` that is neither an ``Exception``, a ``SystemExit`` nor a cancellation) is not
let out of the call's task, where asyncio would raise it out of the event loop past every other
call: the call's result is committed, the other calls are cancelled and answered, and only then
does it propagate to the driver, which ends the turn with it.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Dict, List, Set

__all__ = ["run"]


async def _call(run: Any, index: int, fatal: List[BaseException]) -> None:
    """One call: the checkpoint barrier, then the body; its outcome goes to the plan."""
    if run.checkpoints:
        try:
            await run.flush()
        except asyncio.CancelledError:
            run.aborted_before(index)
            return
    prepared = run.prepare(index)
    if prepared is None:  # decided without running: aborted, or arguments that are not JSON
        return
    fn, args, ctx = prepared
    try:
        value = fn(args, ctx)
        if inspect.isawaitable(value):
            value = await value
    except asyncio.CancelledError:
        run.cancelled(index)
        return
    except GeneratorExit:  # the task itself is being torn down (its event loop closed)
        raise
    except BaseException as exc:
        if run.raised(index, exc):
            fatal.append(exc)  # raised by run() once every call has its result
        return
    # Recorded here, in the call's task: a tool that calls loop.cancel() and then returns
    # finishes in a task asyncio marks cancelled, and its result must still be committed.
    run.returned(index, value)


def _collect(run: Any, tasks: Dict[int, asyncio.Task[None]], done: Set[asyncio.Task[None]]) -> None:
    failed = None
    for index in [i for i, t in tasks.items() if t in done]:
        task = tasks.pop(index)
        if task.cancelled():
            run.cancelled(index)  # a no-op when the body's outcome was recorded
        elif task.exception() is not None:
            # Only the checkpoint barrier (or a commit the log refused) raises: every finished
            # call is looked at before the step fails.
            run.abandon(index)
            failed = failed or task.exception()
    if failed is not None:
        raise failed


async def run(run: Any) -> None:
    """Runs a ``kerman._core.ToolRun`` to the end: every call gets exactly one result."""
    tasks: Dict[int, asyncio.Task[None]] = {}
    fatal: List[BaseException] = []

    def cancel_running(_reason: object = None) -> None:
        for task in tasks.values():
            task.cancel()

    run.signal.add_callback(cancel_running)
    try:
        while not fatal:
            index = run.next()
            if index is not None:
                tasks[index] = asyncio.ensure_future(_call(run, index, fatal))
                continue
            if not tasks:
                return
            done, _ = await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
            _collect(run, tasks, done)
    except asyncio.CancelledError:
        # The driver itself is being cancelled from outside: started calls are cancelled, drain
        # and commit all the same, so the log never holds a call without its result.
        cancel_running()
        if tasks:
            done, _ = await asyncio.shield(asyncio.wait(list(tasks.values())))
            _collect(run, tasks, done)
        run.abort_unstarted()
        raise
    except Exception:
        # The step failed: no call may outlive its step, so the running ones are cancelled and
        # drained; their outcomes are dropped (the log is usually poisoned by then).
        cancel_running()
        if tasks:
            await asyncio.shield(asyncio.wait(list(tasks.values())))
            for task in tasks.values():
                if not task.cancelled():
                    task.exception()  # retrieved, so asyncio does not report it as lost
        raise
    # A body raised what propagates: the others are cancelled and answered, then it goes on.
    cancel_running()
    if tasks:
        done, _ = await asyncio.shield(asyncio.wait(list(tasks.values())))
        _collect(run, tasks, done)
    run.abort_unstarted()
    raise fatal[0]
