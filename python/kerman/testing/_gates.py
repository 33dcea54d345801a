"""The kit's part for ``before_tool`` gates (``docs/decisions.md``): build the ``ToolCall`` the
loop would pass, and run a gate waterfall over it without a model, reading its verdict as the
loop does."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, List, Optional, Sequence, Union

from .. import _core
from ..decisions import Approve, Ask, Deny, Edit, ToolCall, Verdict
from ..errors import ModelError
from ..loop import AgentLoop, _default_gate
from ..signal import Signal
from ..types import ModelRequest

__all__ = ["make_tool_call", "run_gate", "gate_verdict", "GateListener"]

#: A ``before_tool`` gate: ``async def gate(call: ToolCall, next) -> Verdict``.
GateListener = Callable[..., Any]


def _no_model(request: ModelRequest) -> Any:
    raise ModelError("kerman.testing: this loop has no model (it only runs before_tool gates)")


def make_tool_call(
    name: str,
    arguments: Any = None,
    *,
    call_id: str = "call_1",
    turn: int = 1,
    step: int = 1,
    loop: Optional[AgentLoop] = None,
    signal: Optional[Signal] = None,
) -> ToolCall:
    """The ``ToolCall`` the loop would give a gate for a call of tool ``name``. ``arguments``
    are the parsed arguments (a dict, as the loop parses them) or the model's JSON text (parsed
    here; ``None`` when it is not JSON, as in the loop); ``None`` means ``{}``. Without
    ``loop``, ``call.loop`` is a fresh ``AgentLoop`` over a memory log whose model refuses to
    be called."""
    if arguments is None:
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = None
    return ToolCall(
        loop=loop if loop is not None else AgentLoop(_no_model),
        call_id=call_id,
        name=name,
        arguments=arguments,
        turn=turn,
        step=step,
        signal=signal or Signal(),
    )


def _gates(gates: Union[AgentLoop, GateListener, Sequence[GateListener]]) -> List[GateListener]:
    if isinstance(gates, AgentLoop):
        return list(gates._before_tool)
    if callable(gates):
        return [gates]
    out = list(gates)
    for fn in out:
        if not callable(fn):
            raise TypeError(f"a before_tool gate must be callable, got {type(fn).__name__}")
    return out


def _verdict(value: Any) -> Verdict:
    """A verdict as the loop reads it; anything else raises ``TypeError`` (the loop would keep
    the call from running, its result a ``GATE_ERROR``)."""
    problem = None
    if isinstance(value, (Approve, Deny, Ask)):
        return value
    if isinstance(value, Edit):
        try:
            json.dumps(value.arguments, allow_nan=False)
        except (TypeError, ValueError) as error:
            problem = f"edited arguments are not JSON: {error}"
        else:
            if isinstance(value.arguments, dict):
                return value
            problem = "edited arguments must be a JSON object"
    detail = f" ({problem})" if problem else ""
    raise TypeError(
        f"before_tool gate returned {value!r}{detail}; expected Approve, Deny, Edit or Ask "
        "(the loop keeps the call from running: GATE_ERROR)"
    )


async def run_gate(
    gates: Union[AgentLoop, GateListener, Sequence[GateListener]], call: Union[ToolCall, str], arguments: Any = None, **kwargs: Any
) -> Verdict:
    """Runs a ``before_tool`` waterfall over one call and returns its verdict (``Approve``,
    ``Deny``, ``Edit`` or ``Ask``), as the loop would read it.

    ``gates`` is one gate, a list (run in that order), or an ``AgentLoop`` whose registered
    gates run; ``call`` is a ``ToolCall`` you built, or a tool name (with ``arguments`` and
    :func:`make_tool_call`'s keywords). The waterfall is the loop's own, and its default is the
    loop's: ``Ask()`` for a tool of ``call.loop`` that needs approval, else ``Approve()`` (with
    an ``AgentLoop`` as ``gates`` and no ``loop=``, its tools decide). A result the loop would
    refuse raises ``TypeError``; an exception from a gate propagates (the loop would fail the
    call closed)."""
    if not isinstance(call, ToolCall):
        if isinstance(gates, AgentLoop):
            kwargs.setdefault("loop", gates)
        call = make_tool_call(call, arguments, **kwargs)
    elif arguments is not None or kwargs:
        raise TypeError("run_gate takes arguments and keywords with a tool name, not with a ToolCall")
    payload = call

    def default() -> Union[Approve, Ask]:
        return _default_gate(payload)

    return _verdict(await _core.Next(_gates(gates), payload, default)())


def gate_verdict(
    gates: Union[AgentLoop, GateListener, Sequence[GateListener]], call: Union[ToolCall, str], arguments: Any = None, **kwargs: Any
) -> Verdict:
    """:func:`run_gate` from synchronous code (``asyncio.run``): for a plain test function."""
    return asyncio.run(run_gate(gates, call, arguments, **kwargs))
