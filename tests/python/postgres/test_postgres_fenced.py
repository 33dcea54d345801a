"""A loop whose PostgreSQL lease is taken over (issue 6, item 2): the first append that the
database refuses for the stale epoch fences the loop. The turn's signal aborts with cause
`{"kind": "fenced"}`, the loop reports one `agent/error` (code `FENCED`, the `LeaseLostError`
as its exception), appends nothing more — no `turn/end` either: the session now belongs to the
new owner, whose `open` already closed the interrupted turn — and refuses further input until
the session is reopened.

Beyond SPEC: the `FENCED` failure code, and `LeaseLostError` from `followup`/`send`/`wake` of a
fenced loop."""

from __future__ import annotations

import asyncio

import pytest

from conftest import PG_DSN as DSN
from conftest import needs_postgres
from kerman import AgentLoop, LeaseLostError, ModelReply, PostgresStore, ToolResult

pytestmark = needs_postgres


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def types(events):
    return [e.type for e in events]


def test_a_takeover_during_the_model_call_fences_the_loop_before_its_tool_runs():
    # lease_ttl=0: leases lapse at once, so the second store may take the session over.
    old, new = PostgresStore(DSN, lease_ttl=0), PostgresStore(DSN, lease_ttl=0)
    log = old.create()
    taken = []
    tool_ran = []
    errors = []

    async def model(request):
        if not taken:
            taken.append(new.open(log.id))  # the takeover: epoch + 1
        return ModelReply([{"type": "tool-call", "id": "c1", "name": "probe", "arguments": "{}"}])

    async def scenario():
        loop = AgentLoop(model, log=log)

        @loop.tool
        async def probe(args, ctx):
            tool_ran.append(ctx.call_id)
            return ToolResult("ran")

        seen = []
        loop.on("agent/error", lambda ev: errors.append(ev))
        loop.on("agent/status", lambda ev: seen.append(ev.status))
        loop.followup("go")
        signal = loop._signal
        await loop.when_idle()
        assert signal.reason == {"kind": "fenced"}
        assert loop.status == "idle" and seen[-1] == "idle"
        with pytest.raises(LeaseLostError):
            loop.followup("after the fence")
        with pytest.raises(LeaseLostError):
            loop.wake()
        await loop.aclose()  # no flush of a fenced log: returns quietly

    run(scenario())
    assert tool_ran == [], "the checkpoint before the tool body failed: the tool never ran"
    assert len(errors) == 1
    assert errors[0].error["code"] == "FENCED"
    assert isinstance(errors[0].exception, LeaseLostError)
    # Nothing of the old owner after the takeover reached the database: the new owner's view
    # is what the old one had flushed (turn/start, the claim, the user message) plus the crash
    # closers its open added.
    new_log = taken[0]
    stored = types(new_log)
    assert "assistant/message" not in stored and "tool/call" not in stored
    assert stored[-1] == "turn/end" and new_log[len(new_log) - 1].data["reason"]["kind"] == "interrupted"
    assert "turn/end" not in types(log), "the fenced loop appended no turn/end of its own"
    new_log.close()
    # The fenced handle is closed like any other: closing it reports the lost lease.
    with pytest.raises(LeaseLostError):
        log.close()
    assert log.closed


def test_a_takeover_while_a_tool_runs_fences_the_next_step():
    old, new = PostgresStore(DSN, lease_ttl=0), PostgresStore(DSN, lease_ttl=0)
    log = old.create()
    requests = []
    errors = []

    async def model(request):
        requests.append(request.step)
        if request.step == 1:
            return ModelReply([{"type": "tool-call", "id": "c1", "name": "takeover", "arguments": "{}"}])
        return ModelReply([{"type": "text", "text": "never reached"}])

    async def scenario():
        loop = AgentLoop(model, log=log)
        holder = []

        @loop.tool
        async def takeover(args, ctx):
            holder.append(new.open(log.id))
            return "the session is someone else's now"

        loop.on("agent/error", lambda ev: errors.append(ev))
        loop.followup("go")
        await loop.when_idle()
        await loop.aclose()
        return holder[0]

    new_log = run(scenario())
    # The tool's result could not be committed past the new epoch: the checkpoint before the
    # second request failed, so the model was asked once.
    assert requests == [1]
    assert [e.error["code"] for e in errors] == ["FENCED"]
    # The tool's own result never reached the database: the new owner's open closed the call
    # as outcome-unknown, then the step and the turn.
    assert types(new_log)[-4:] == ["tool/call", "tool/result", "step/end", "turn/end"]
    assert new_log[len(new_log) - 3].data["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert new_log[len(new_log) - 1].data["reason"] == {"kind": "interrupted"}
    new_log.close()
    # The fenced handle is closed like any other: closing it reports the lost lease.
    with pytest.raises(LeaseLostError):
        log.close()
    assert log.closed
