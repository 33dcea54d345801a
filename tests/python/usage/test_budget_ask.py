"""``Budget(ask=True)``: a stop before a model request asks a person (a ``budget`` decision
request) instead of ending the turn; the request lives in the log, so a reopened loop waits
and another process may decide it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, List

import pytest

import kerman
from kerman import AgentLoop, Approve, Deny, ModelReply, RunError
from kerman.cli._timeline import _decision_requested
from kerman.ui import AgUiProjection, VercelProjection


class Calls:
    """A model that asks for a tool on every request but the ``answer_at``-th, 600 tokens each."""

    def __init__(self, answer_at: int = 3) -> None:
        self.answer_at = answer_at
        self.requests = 0

    async def __call__(self, request: kerman.ModelRequest) -> ModelReply:
        self.requests += 1
        usage = {"input": 500, "output": 100}
        if self.requests >= self.answer_at:
            return ModelReply("done", usage=usage)
        call = {"type": "tool-call", "id": f"c{self.requests}", "name": "look", "arguments": "{}"}
        return ModelReply([call], usage=usage)


async def look(args: Any, ctx: Any) -> str:
    return "seen"


def build(model: Calls, log: Any = None) -> AgentLoop:
    return AgentLoop(model, log, tools=[kerman.Tool("look", look)], budget=kerman.Budget(tokens=1000, ask=True))


def budget_requests(loop_or_log: Any) -> List[Any]:
    log = getattr(loop_or_log, "log", loop_or_log)
    return [e for e in log.events(types="decision/requested") if e.data["kind"] == "budget"]


def test_a_budget_that_asks_waits_and_an_approval_lets_the_request_through() -> None:
    async def main() -> None:
        model = Calls(answer_at=3)
        loop = build(model)
        assert repr(loop.budget) == "Budget(tokens=1000, per='session', ask=True)"
        loop.followup("look around")
        await loop.when_idle()
        # 600, then 1200 tokens: the third request waits for a person.
        assert model.requests == 2 and loop.status == "waiting"
        [pending] = loop.decisions
        assert (pending.kind, pending.name, pending.call_id) == ("budget", "budget", "")
        numbers = json.loads(pending.arguments)
        assert {k: numbers[k] for k in ("at", "limit", "max", "spent")} == {"at": "request", "limit": "tokens", "max": 1000, "spent": 1200}
        assert "tokens 1200 of 1000 per session" in (pending.note or "")
        assert not [e for e in loop.log.events(types="turn/end") if e.data["turn"] == 1]
        shown = _decision_requested(kerman.events.view(budget_requests(loop)[0]))
        assert shown.startswith('budget? {"at":"request"') and pending.decision_id in shown, shown
        assert loop.decide(pending.decision_id, Approve(), by="ann")
        await loop.when_idle()
        assert model.requests == 3 and loop.status == "idle" and loop.decisions == []
        [end] = [e.data["reason"] for e in loop.log.events(types="turn/end")]
        assert end["kind"] == "completed"
        [resolved] = [e.data for e in loop.log.events(types="decision/resolved")]
        assert (resolved["decisionId"], resolved["outcome"], resolved["by"]) == (pending.decision_id, "approved", "ann")
        # One request was let through: the next one asks again.
        assert len(budget_requests(loop)) == 1
        await loop.aclose()

    asyncio.run(main())


def test_a_denial_ends_the_turn_with_the_budget_ending() -> None:
    async def main() -> None:
        model = Calls(answer_at=10)
        loop = build(model)
        loop.followup("look around")
        await loop.when_idle()
        [pending] = loop.decisions
        loop.decide(pending.decision_id, Deny("enough"))
        await loop.when_idle()
        assert model.requests == 2 and loop.status == "idle"
        [end] = [e.data["reason"] for e in loop.log.events(types="turn/end")]
        assert (end["kind"], end["at"], end["limit"], end["spent"]) == ("budget", "request", "tokens", 1200)
        with pytest.raises(RunError) as raised:
            await loop.run("more")
        # The claim-time stop stays a plain stop: no new request.
        assert raised.value.ending["at"] == "claim" and len(budget_requests(loop)) == 1
        await loop.aclose()

    asyncio.run(main())


def test_the_request_survives_a_restart_and_another_process_decides_it(tmp_path: Path) -> None:
    store = kerman.FileStore(tmp_path, durability="none")

    async def ask() -> str:
        log = store.create("s")
        loop = build(Calls(answer_at=3), log)
        loop.followup("look around")
        await loop.when_idle()
        [pending] = loop.decisions
        await loop.aclose()
        log.close()
        return pending.decision_id

    decision_id = asyncio.run(ask())

    async def reopened_waits() -> None:
        log = store.open("s")
        loop = build(Calls(), log)
        assert loop.status == "waiting" and [d.decision_id for d in loop.decisions] == [decision_id]
        await loop.aclose()
        log.close()

    asyncio.run(reopened_waits())
    applied = store.decide("s", decision_id, Approve(), key="k1")
    assert applied["applied"] is True, applied

    async def resume() -> None:
        model = Calls(answer_at=1)
        log = store.open("s")
        loop = build(model, log)
        assert loop.decisions == []
        assert loop.wake() is True  # the budget request is decided: the step goes on
        await loop.when_idle()
        # The approval in the log lets the request through: no second budget request.
        assert model.requests == 1 and len(budget_requests(loop)) == 1
        [end] = [e.data["reason"] for e in loop.log.events(types="turn/end")]
        assert end["kind"] == "completed"
        await loop.aclose()
        log.close()

    asyncio.run(resume())


def test_the_budget_request_shows_in_agui_and_vercel_without_a_tool_call() -> None:
    async def main() -> List[Any]:
        loop = build(Calls(answer_at=10))
        loop.followup("go")
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events

    events = asyncio.run(main())
    projection = AgUiProjection("t")
    agui = [e for ev in events for e in projection.feed(ev)]
    starts = [e for e in agui if e["type"] == "TOOL_CALL_START"]
    assert [e["toolCallName"] for e in starts] == ["look", "look"]
    interrupts = [i for e in agui if e["type"] == "RUN_FINISHED" for i in (e.get("outcome") or {}).get("interrupts", [])]
    assert [i["reason"] for i in interrupts] == ["budget"], agui[-3:]
    vercel = VercelProjection()
    parts = [p for ev in events for p in vercel.feed(ev)]
    assert not [p for p in parts if p["type"] == "tool-input-available" and p.get("toolName") == "budget"]
    [decision] = [p for p in parts if p["type"] == "data-decision"]
    assert (decision["data"]["kind"], decision["data"]["status"]) == ("budget", "pending")
