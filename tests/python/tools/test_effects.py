"""Effect classes, in-doubt policies and idempotency keys (issue 28 items 1-2,
``docs/durability.md#calls-in-doubt``): what a ``Tool`` accepts and refuses, what its repr and
each call's ``tool/call`` record say, and the key a body gets."""

import asyncio

import pytest

from kerman import AgentLoop, FileStore, MemoryStore, ModelReply, Tool, events
from kerman.models import ScriptedModel


def body(args, ctx):
    return "ok"


def reconcile(ctx):
    return None


def test_the_defaults_are_write_and_fail():
    tool = Tool("t", body)
    assert (tool.effect, tool.on_in_doubt) == ("write", "fail")
    assert repr(tool) == "Tool('t', parallel=True)"


def test_the_repr_shows_what_is_not_the_default():
    assert repr(Tool("t", body, effect="read", on_in_doubt="retry")) == "Tool('t', parallel=True, effect='read', on_in_doubt='retry')"
    assert repr(Tool("t", body, effect="idempotent")) == "Tool('t', parallel=True, effect='idempotent')"
    assert repr(Tool("t", body, on_in_doubt="ask")) == "Tool('t', parallel=True, on_in_doubt='ask')"
    assert repr(Tool("t", body, on_in_doubt=reconcile)) == "Tool('t', parallel=True, on_in_doubt=reconcile)"


@pytest.mark.parametrize("effect", ["Write", "", None, "delete"])
def test_a_bad_effect_is_refused_naming_it(effect):
    with pytest.raises(ValueError, match=f"tool 't': effect must be .*got {effect!r}"):
        Tool("t", body, effect=effect)


@pytest.mark.parametrize("policy", ["reconcile", "Retry", None, 3])
def test_a_bad_policy_is_refused_naming_it(policy):
    with pytest.raises(ValueError, match=f"tool 't': on_in_doubt must be .*got {policy!r}"):
        Tool("t", body, on_in_doubt=policy)


def test_retry_is_refused_for_a_write():
    with pytest.raises(ValueError, match=r"tool 'pay': on_in_doubt='retry' needs effect='read' or 'idempotent'"):
        Tool("pay", body, on_in_doubt="retry")
    for effect in ("read", "idempotent"):
        assert Tool("t", body, effect=effect, on_in_doubt="retry").on_in_doubt == "retry"


def _run(log, tools, replies):
    keys = {}

    async def main():
        loop = AgentLoop(ScriptedModel(replies), log=log)
        for name, effect, policy in tools:

            def fn(args, ctx, name=name):
                keys.setdefault(ctx.call_id, []).append(ctx.idempotency_key)
                return name

            loop.tool(Tool(name, fn, effect=effect, on_in_doubt=policy))
        loop.followup("go")
        await loop.when_idle()
        await loop.aclose()

    asyncio.run(main())
    return keys


def _calls(*ids):
    return ModelReply([{"type": "tool-call", "id": i, "name": n, "arguments": "{}"} for i, n in ids])


TOOLS = [("look", "read", "retry"), ("put", "idempotent", reconcile), ("pay", "write", "ask"), ("send", "write", "fail")]


def test_each_tool_call_record_carries_the_effect_and_the_policy():
    log = MemoryStore().create()
    _run(log, TOOLS, [_calls(("c1", "look"), ("c2", "put"), ("c3", "pay"), ("c4", "send")), "done"])
    records = {e.data["callId"]: e.data for e in log.events() if e.type == "tool/call"}
    assert records["c1"]["effect"] == "read" and records["c1"]["onInDoubt"] == "retry"
    assert records["c2"]["effect"] == "idempotent" and records["c2"]["onInDoubt"] == "reconcile"
    assert "effect" not in records["c3"] and records["c3"]["onInDoubt"] == "ask"
    # The defaults are left out: a record of today's tools is what it always was.
    assert set(records["c4"]) == {"turn", "step", "callId", "name", "arguments"}
    views = {v.call_id: (v.effect, v.on_in_doubt) for v in log.events(view=True) if isinstance(v, events.ToolCall)}
    assert views == {"c1": ("read", "retry"), "c2": ("idempotent", "reconcile"), "c3": ("write", "ask"), "c4": ("write", "fail")}


def test_the_idempotency_key_is_the_session_and_the_call_records_position(tmp_path):
    log = FileStore(tmp_path, durability="none").create()
    keys = _run(log, TOOLS[:2], [_calls(("c1", "look"), ("c2", "look")), _calls(("c1", "put")), "done"])
    seqs = [e.seq for e in log.events() if e.type == "tool/call"]
    assert keys == {"c1": [f"kerman:{log.id}:{seqs[0]}", f"kerman:{log.id}:{seqs[2]}"], "c2": [f"kerman:{log.id}:{seqs[1]}"]}
    # A call id the model repeats in a later step still gets a key of its own.
    assert len({k for ks in keys.values() for k in ks}) == 3
    log.close()
