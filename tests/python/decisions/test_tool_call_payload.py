"""``kerman.ToolCall``, the ``before_tool`` payload (docs/decisions.md): a native object whose
arguments are parsed when first read. What the dataclass it replaced offered still holds
(fields, repr, equality without a hash, copy and pickle, ``dataclasses`` functions, pattern
matching); what is new is that it is read-only, and that building it costs no Python call."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import operator
import pickle
import sys
from typing import Any, Dict, List

import pytest

import kerman
from kerman import AgentLoop, ModelReply, ToolCall, testing
from kerman.models import ScriptedModel
from kerman.signal import Signal


def one_call(arguments: str, turns: int = 1) -> ScriptedModel:
    reply = ModelReply([{"type": "tool-call", "id": "c1", "name": "t", "arguments": arguments}])
    return ScriptedModel([reply, "done"] * turns)


def gated_loop(arguments: str, gate: Any, ran: List[Dict[str, Any]], turns: int = 1) -> AgentLoop:
    async def t(args: Dict[str, Any], ctx: kerman.ToolContext) -> str:
        ran.append(args)
        return "ok"

    loop = AgentLoop(one_call(arguments, turns), tools=[kerman.Tool("t", t)])
    if gate is not None:
        loop.before_tool(gate)
    return loop


def seen_calls(arguments: str) -> List[ToolCall]:
    seen: List[ToolCall] = []

    async def gate(call: ToolCall, next: Any) -> Any:
        seen.append(call)
        return await next()

    async def main() -> None:
        loop = gated_loop(arguments, gate, [])
        loop.followup("go")
        await loop.when_idle()

    asyncio.run(main())
    return seen


def test_the_gate_gets_the_call_parsed_as_the_tool_gets_it() -> None:
    (call,) = seen_calls('{"n": 1, "big": 123456789012345678901234567890, "x": [1.5, null, "s"]}')
    assert isinstance(call, ToolCall) and type(call) is kerman.decisions.ToolCall
    assert (call.call_id, call.name, call.turn, call.step) == ("c1", "t", 1, 1)
    assert call.arguments == {"n": 1, "big": 123456789012345678901234567890, "x": [1.5, None, "s"]}
    assert call.arguments is call.arguments  # parsed once, then kept
    assert isinstance(call.loop, AgentLoop) and isinstance(call.signal, Signal)
    assert [type(v) for v in (call.call_id, call.name, call.turn, call.step)] == [str, str, int, int]


def test_arguments_that_are_not_json_read_as_none_and_empty_ones_as_an_empty_object() -> None:
    assert seen_calls("{not json")[0].arguments is None
    assert seen_calls("")[0].arguments == {}


def test_what_a_gate_does_to_the_parsed_arguments_never_reaches_the_tool() -> None:
    ran: List[Dict[str, Any]] = []

    async def gate(call: ToolCall, next: Any) -> Any:
        call.arguments["n"] = 99
        return await next()

    async def main() -> None:
        loop = gated_loop('{"n": 1}', gate, ran)
        loop.followup("go")
        await loop.when_idle()

    asyncio.run(main())
    assert ran == [{"n": 1}]


def test_the_payload_is_read_only() -> None:
    (call,) = seen_calls('{"n": 1}')
    for field in ("call_id", "name", "arguments", "turn", "step", "loop", "signal"):
        with pytest.raises(AttributeError):
            setattr(call, field, None)
    with pytest.raises(AttributeError):
        call.note = "mine"  # type: ignore[attr-defined]


def make(**changes: Any) -> ToolCall:
    fields: Dict[str, Any] = dict(loop=None, call_id="c1", name="pay", arguments={"amount": 3}, turn=2, step=1, signal=None)
    fields.update(changes)
    return ToolCall(**fields)


def test_built_from_python_by_keyword_or_position() -> None:
    by_keyword = make()
    by_position = ToolCall(None, "c1", "pay", {"amount": 3}, 2, 1, None)  # type: ignore[arg-type]
    assert by_keyword == by_position
    assert by_keyword.arguments is not None and by_keyword.arguments == {"amount": 3}
    assert make(arguments=None).arguments is None
    with pytest.raises(TypeError, match="call_id"):
        make(call_id=7)
    with pytest.raises(TypeError):
        ToolCall(None, "c1", "pay")  # type: ignore[call-arg]


def test_repr_is_the_constructor_form() -> None:
    call = make(loop="L", signal="S")
    assert repr(call) == "ToolCall(loop='L', call_id='c1', name='pay', arguments={'amount': 3}, turn=2, step=1, signal='S')"
    (seen,) = seen_calls('{"n": 1}')
    assert repr(seen).startswith("ToolCall(loop=<AgentLoop ") and "arguments={'n': 1}, turn=1, step=1, signal=" in repr(seen)


def test_equal_by_fields_and_unhashable() -> None:
    assert make() == make() and not (make() != make())
    assert make() != make(turn=3) and make() != make(arguments={"amount": 4})
    assert make() != ("c1", "pay") and make().__eq__(object()) is NotImplemented
    with pytest.raises(TypeError, match="unhashable"):
        hash(make())
    with pytest.raises(TypeError):
        operator.lt(make(), make())
    # A parsed call equals one built from the same values.
    (seen,) = seen_calls('{"n": 1}')
    assert seen == ToolCall(seen.loop, "c1", "t", {"n": 1}, 1, 1, seen.signal)


def test_copy_and_pickle() -> None:
    call = make(signal=Signal())
    shallow = copy.copy(call)
    assert shallow == call and shallow is not call and shallow.arguments is call.arguments
    deep = copy.deepcopy(call)
    assert deep.arguments == call.arguments and deep.arguments is not call.arguments
    again = pickle.loads(pickle.dumps(call))
    assert (type(again), again.name, again.arguments, again.turn) == (ToolCall, "pay", {"amount": 3}, 2)


def test_the_dataclasses_functions_and_pattern_matching_still_work() -> None:
    call = make()
    assert dataclasses.is_dataclass(call)
    assert [f.name for f in dataclasses.fields(call)] == ["loop", "call_id", "name", "arguments", "turn", "step", "signal"]
    edited = dataclasses.replace(call, arguments={"amount": 4}, turn=5)
    assert type(edited) is ToolCall and (edited.arguments, edited.turn, edited.call_id) == ({"amount": 4}, 5, "c1")
    assert dataclasses.asdict(call)["arguments"] == {"amount": 3}
    assert ToolCall.__match_args__ == ("loop", "call_id", "name", "arguments", "turn", "step", "signal")
    if sys.version_info >= (3, 13):
        assert copy.replace(call, step=9).step == 9  # type: ignore[attr-defined]


def test_an_approving_gate_adds_one_python_call_per_tool_call_itself() -> None:
    """The payload and the default verdict are native: per gated call, the only Python function
    entered is the gate (the dataclass payload's ``__init__`` was a second one)."""
    turns = 20

    async def gate(call: ToolCall, next: Any) -> Any:
        return await next()

    def python_calls(with_gate: bool) -> int:
        count = [0]

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                count[0] += 1

        async def main() -> None:
            loop = gated_loop('{"n": 1}', gate if with_gate else None, [], turns + 1)
            loop.followup("warm up")  # the first turn's one-off work is not counted
            await loop.when_idle()
            sys.setprofile(profile)
            try:
                for _ in range(turns):
                    loop.followup("go")
                    await loop.when_idle()
            finally:
                sys.setprofile(None)

        asyncio.run(main())
        return count[0]

    assert python_calls(True) - python_calls(False) == turns


def test_make_tool_call_builds_the_native_payload() -> None:
    call = testing.make_tool_call("pay", json.dumps({"amount": 3}))
    assert type(call) is ToolCall and call.arguments == {"amount": 3}


def test_a_loop_that_keeps_the_calls_its_gate_saw_is_freed() -> None:
    """The payload takes part in the collector: a cycle through it (the loop keeps its calls,
    each call refers to the loop; a call kept inside its own arguments) is collected."""
    import gc
    import weakref

    async def session() -> List[Any]:
        loop = gated_loop('{"n": 1}', None, [])
        kept: List[ToolCall] = []

        async def gate(call: ToolCall, next: Any) -> Any:
            kept.append(call)
            call.arguments["self"] = call
            return await next()

        loop.before_tool(gate)
        loop.kept = kept  # type: ignore[attr-defined]
        loop.followup("go")
        await loop.when_idle()
        await loop.aclose()
        assert len(kept) == 1
        return [weakref.ref(loop), weakref.ref(loop.log), weakref.ref(gate)]

    async def main() -> List[Any]:
        return [ref for _ in range(3) for ref in await session()]

    refs = asyncio.run(main())
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
