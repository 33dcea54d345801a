"""Reports of exceptions raised by user code (the model, a tool, a pre-step listener).

Each is reported three ways, so a bug is never silent: on the ``kerman`` logger with its
traceback, on the ``agent/error`` live event (``.exception``, ``.traceback``, ``.function``,
kept as ``loop.last_error``), and in the log itself, where the failure a turn ends with (or a
tool's error result) carries the exception type, the traceback text and the user function, so
``kerman log show`` explains a failed turn after the process is gone.
"""

from __future__ import annotations

import logging
import os
import traceback
from typing import TYPE_CHECKING, Any, Dict, Optional

from .hooks import LiveEvent

if TYPE_CHECKING:
    from .loop import AgentLoop

_log = logging.getLogger("kerman")

# A traceback is kept whole up to this many characters; past it, its end (where the error is).
TRACEBACK_LIMIT = 16_000

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def traceback_text(exc: BaseException) -> str:
    """The exception as Python prints it (cause chain included), its end kept if very long."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(text) > TRACEBACK_LIMIT:
        cut = len(text) - TRACEBACK_LIMIT
        text = f"[{cut} characters of traceback left out]\n" + text[cut:]
    return text


def _name(code: Any) -> str:
    return str(getattr(code, "co_qualname", code.co_name))  # co_qualname: Python 3.11+


def user_function(exc: BaseException) -> Optional[str]:
    """The qualified name of the user function the exception came out of: the outermost frame
    of its traceback that is not Kerman's own (the loop calls user code from native code, so
    that frame is the model, tool or listener it called). ``None`` if it never entered user
    code (a call with the wrong arguments raises before the function runs)."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if not os.path.abspath(code.co_filename).startswith(_PACKAGE):
            return _name(code)
        tb = tb.tb_next
    return None


def callable_name(fn: Any) -> Optional[str]:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else None


def describe(exc: BaseException, fallback: Optional[str] = None, *, typed: bool = True) -> Dict[str, Any]:
    """The durable part of a report: ``exceptionType`` (unless ``typed`` is false: a tool's
    error names its class as ``name`` already), ``function`` (when known) and ``traceback``,
    JSON values all."""
    record: Dict[str, Any] = {"exceptionType": type(exc).__name__} if typed else {}
    function = user_function(exc) or fallback
    if function is not None:
        record["function"] = function
    record["traceback"] = traceback_text(exc)
    return record


def report(loop: AgentLoop, turn: int, step: int, error: Dict[str, Any], exc: Optional[BaseException], text: str) -> None:
    """Logs ``text`` (with the traceback), keeps the ``agent/error`` event as the loop's
    ``last_error`` and emits it."""
    live = LiveEvent(
        "agent/error",
        loop,
        turn=turn,
        step=step,
        error=error,
        exception=exc,
        traceback=error.get("traceback") if exc is not None else None,
        function=error.get("function"),
    )
    loop._last_error = live
    _log.error(text, exc_info=exc)
    loop._emit_live(live)


def turn_failed(loop: AgentLoop, turn: int, step: int, failure: Dict[str, Any], exc: Optional[BaseException]) -> None:
    """A turn ends with ``failure`` (the dict its ``turn/end`` carries); ``step`` is the last
    step it entered."""
    where = f" (raised in {failure['function']})" if failure.get("function") else ""
    text = f"turn {turn} failed: {failure.get('message')} [{failure.get('code')}]{where}"
    report(loop, turn, step, failure, exc, text)


def tool_failed(loop: AgentLoop, turn: int, step: int, failure: Dict[str, Any], exc: Optional[BaseException]) -> None:
    """A tool's bug: it raised ``exc``, or (``exc`` None) returned what is not a result. Its
    error result goes to the model and the turn goes on. ``failure`` is the result's error with
    the result text as ``message``, the ``callId`` and the ``tool``."""
    where = f"tool {failure.get('tool')!r} (call {failure.get('callId')!r}, turn {turn} step {step})"
    if exc is not None:
        what = f"raised {type(exc).__name__}: {exc}"
    else:  # the message names the tool already: "tool 't' returned int; expected str or ToolResult"
        what = f"failed: {failure.get('message')}"
    report(loop, turn, step, failure, exc, f"{where} {what}; the model gets it as the call's error result")
