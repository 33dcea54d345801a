"""Budgets (``AgentLoop(budget=kerman.Budget(...))``): checked when input is claimed and before
every model request, counted per turn or per session, rebuilt from the log by a loop that opens
the session in another process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from decimal import Decimal
from typing import Any, Dict, List

import pytest

import kerman
from kerman import AgentLoop, ModelReply, RunError
from kerman.ui import AgUiProjection, VercelProjection


class Calls:
    """A model that asks for a tool on every request, each reporting ``tokens`` tokens."""

    def __init__(self, tokens: int = 600, answer_after: int = 1000) -> None:
        self.tokens = tokens
        self.answer_after = answer_after
        self.requests = 0

    async def __call__(self, request: kerman.ModelRequest) -> ModelReply:
        self.requests += 1
        usage = {"input": self.tokens - 100, "output": 100, "cacheRead": 0, "cacheWrite": 0, "reasoning": 0}
        if self.requests % self.answer_after == 0:
            return ModelReply("done", usage=usage)
        call = {"type": "tool-call", "id": f"c{self.requests}", "name": "look", "arguments": "{}"}
        return ModelReply([call], usage=usage)


async def look(args: Any, ctx: Any) -> str:
    return "seen"


def tools() -> List[kerman.Tool]:
    return [kerman.Tool("look", look)]


def ends(loop: AgentLoop) -> List[Dict[str, Any]]:
    return [e.data["reason"] for e in loop.log.events(types="turn/end")]


def types_of_turn(loop: AgentLoop, turn: int) -> List[str]:
    out, inside = [], False
    for e in loop.log.events():
        if e.type == "turn/start":
            inside = e.data["turn"] == turn
        if inside and e.type != "agent/inbox/spliced":
            out.append(e.type)
    return out


def test_a_request_the_budget_cannot_afford_is_not_made_and_the_turn_ends_budget():
    async def main() -> None:
        model = Calls(tokens=600)
        loop = AgentLoop(model, tools=tools(), budget=kerman.Budget(tokens=1000))
        with pytest.raises(RunError) as raised:
            await loop.run("look around")
        # 600, then 1200 tokens: the third request is not made.
        assert model.requests == 2
        ending = raised.value.ending
        assert ending["kind"] == "budget" and raised.value.kind == "budget"
        assert {k: ending[k] for k in ("at", "per", "limit", "max", "spent")} == {
            "at": "request",
            "per": "session",
            "limit": "tokens",
            "max": 1000,
            "spent": 1200,
        }
        assert ending["used"]["requests"] == 2 and ending["used"]["toolCalls"] == 2
        # The overshoot is at most the request in flight.
        assert ending["spent"] - ending["max"] <= model.tokens
        assert "budget is spent (tokens 1200 of 1000 per session" in str(raised.value)
        # The step that would have made the request is closed, then the turn ends.
        assert types_of_turn(loop, 1)[-3:] == ["step/start", "step/end", "turn/end"]
        assert loop.spent()["session"]["tokens"] == 1200
        await loop.aclose()

    asyncio.run(main())


def test_a_spent_session_budget_rejects_the_next_input_at_the_claim():
    async def main() -> None:
        model = Calls(tokens=700, answer_after=2)
        loop = AgentLoop(model, tools=tools(), budget=kerman.Budget(tokens=1000))
        first = await loop.run("one")  # 700 tokens, then 1400: the turn had completed already
        assert first.ending == {"kind": "completed"}
        first_end = len(loop.log) - 1
        with pytest.raises(RunError) as raised:
            await loop.run("two")
        assert model.requests == 2
        ending = raised.value.ending
        assert (ending["at"], ending["limit"], ending["spent"], raised.value.turn) == ("claim", "tokens", 1400, 2)
        # Nothing of turn 2 was entered: the stop is the claim's next append.
        assert types_of_turn(loop, 2) == ["turn/start", "turn/end"]
        turn2 = [e.type for e in loop.log.events() if e.seq > first_end]
        assert turn2 == ["agent/inbox/spliced", "turn/start", "agent/inbox/spliced", "turn/end"]
        # The claimed input is unread (``/resend`` and ``requeue`` send it again).
        assert [(item["turn"], item["message"].text) for item in loop.log.transcript().unread()] == [(2, "two")]
        await loop.aclose()

    asyncio.run(main())


def test_a_budget_per_turn_starts_each_turn_from_nothing():
    async def main() -> None:
        model = Calls(tokens=10)
        loop = AgentLoop(model, tools=tools(), budget=kerman.Budget(requests=2, per="turn"))
        for prompt in ("one", "two"):
            with pytest.raises(RunError) as raised:
                await loop.run(prompt)
            assert (raised.value.ending["at"], raised.value.ending["limit"], raised.value.ending["spent"]) == ("request", "requests", 2)
        assert model.requests == 4
        assert loop.spent()["session"]["requests"] == 4 and loop.spent()["thisTurn"]["requests"] == 2
        await loop.aclose()

    asyncio.run(main())


def test_tool_calls_and_requests_limits_per_session():
    async def main() -> None:
        model = Calls(tokens=10)
        loop = AgentLoop(model, tools=tools(), budget=kerman.Budget(tool_calls=3))
        with pytest.raises(RunError) as raised:
            await loop.run("go")
        assert (raised.value.ending["limit"], raised.value.ending["spent"], model.requests) == ("toolCalls", 3, 3)
        await loop.aclose()

    asyncio.run(main())


def test_a_usd_budget_reads_the_price_logged_with_each_request():
    def pricer(request: Any) -> Decimal:
        assert request.totals.prompt == 500 and request.totals.output == 100
        return Decimal("0.004")

    async def main() -> None:
        model = Calls(tokens=600)
        loop = AgentLoop(model, tools=tools(), budget=kerman.Budget(usd="0.01", pricer=pricer))
        with pytest.raises(RunError) as raised:
            await loop.run("go")
        # 0.004, 0.008, 0.012: the fourth request is not made.
        assert model.requests == 3
        assert raised.value.ending["limit"] == "usd" and raised.value.ending["max"] == 0.01
        prices = [e.data["usage"]["costUsd"] for e in loop.log.events(types="assistant/message")]
        assert prices == ["0.004"] * 3
        # The ledger reads the same log.
        book = kerman.usage.ledger(loop.log, pricer=pricer)
        assert book.session.cost == Decimal("0.012")
        await loop.aclose()

    asyncio.run(main())


def test_a_usd_budget_stops_after_a_request_of_unknown_price():
    async def main() -> None:
        model = Calls(tokens=600)
        loop = AgentLoop(model, tools=tools(), budget=kerman.Budget(usd=5, pricer=lambda request: None))
        with pytest.raises(RunError) as raised:
            await loop.run("go")
        assert model.requests == 1
        assert raised.value.ending["used"]["unpriced"] == 1
        await loop.aclose()

    asyncio.run(main())


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import kerman

    async def model(request):
        return kerman.ModelReply("ok", usage={"input": 1100, "output": 100})

    async def main():
        store = kerman.FileStore(sys.argv[1], durability="strict")
        with store.create("s") as log:
            loop = kerman.AgentLoop(model, log, budget=kerman.Budget(tokens=1000))
            result = await loop.run("spend")
            print(result.ending["kind"], loop.spent()["session"]["tokens"])
            await loop.aclose()

    asyncio.run(main())
    """
)


def test_the_spent_amount_is_rebuilt_from_the_log_in_another_process(tmp_path):
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["completed", "1200"]

    async def model(request: kerman.ModelRequest) -> ModelReply:
        raise AssertionError("the budget is spent: no request is made")

    async def main() -> None:
        store = kerman.FileStore(str(tmp_path))
        with store.open("s") as log:
            loop = AgentLoop(model, log, budget=kerman.Budget(tokens=1000))
            assert loop.spent()["session"]["tokens"] == 1200
            with pytest.raises(RunError) as raised:
                await loop.run("more")
            assert (raised.value.ending["at"], raised.value.ending["spent"], raised.value.turn) == ("claim", 1200, 2)
            await loop.aclose()

    asyncio.run(main())


def test_the_budget_ending_in_every_view():
    async def main() -> List[Any]:
        loop = AgentLoop(Calls(tokens=600), tools=tools(), budget=kerman.Budget(tokens=1000))
        with pytest.raises(RunError):
            await loop.run("go")
        events = list(loop.log.events())
        await loop.aclose()
        return events

    events = asyncio.run(main())
    end = kerman.events.view(events[-1])
    stop = end.reason.budget
    assert (stop.limit, stop.max, stop.spent, stop.per, stop.at) == ("tokens", 1000, 1200, "session", "request")
    assert stop.text() == "tokens 1200 of 1000 per session, before a request"
    projection = AgUiProjection("t")
    errors = [e for ev in events for e in projection.feed(ev) if e["type"] == "RUN_ERROR"]
    assert [(e["code"], e["message"]) for e in errors] == [
        ("BUDGET", "the turn's budget is spent: tokens 1200 of 1000 per session, before a request")
    ]
    vercel = VercelProjection()
    parts = [p for ev in events for p in vercel.feed(ev) if p["type"] in ("error", "finish")]
    assert parts[0] == {"type": "error", "errorText": "the turn's budget is spent: tokens 1200 of 1000 per session, before a request"}
    assert parts[1]["finishReason"] == "error" and parts[1]["messageMetadata"]["reason"]["kind"] == "budget"


def test_the_notebook_view_shows_the_budget():
    async def main() -> None:
        loop = AgentLoop(Calls(), budget=kerman.Budget(tokens=1000, per="turn"))
        assert "<th>budget</th><td>Budget(tokens=1000, per=&#x27;turn&#x27;)</td>" in loop._repr_html_()
        assert loop.budget == kerman.Budget(tokens=1000, per="turn")
        await loop.aclose()

    asyncio.run(main())


def test_bad_budgets_are_refused_naming_the_value():
    with pytest.raises(ValueError, match="tokens must be an int >= 0 or None, got -1"):
        kerman.Budget(tokens=-1)
    with pytest.raises(ValueError, match="per must be 'turn' or 'session', got 'day'"):
        kerman.Budget(tokens=1, per="day")
    with pytest.raises(ValueError, match="needs at least one limit"):
        kerman.Budget()
    with pytest.raises(ValueError, match="usd must be a number >= 0 or None, got 'lots'"):
        kerman.Budget(usd="lots")
    with pytest.raises(TypeError, match="budget must be a kerman.Budget or None, got dict"):
        AgentLoop(Calls(), budget={"tokens": 1})  # type: ignore[arg-type]
    assert repr(kerman.Budget(usd="0.5", tool_calls=3, per="turn")) == "Budget(usd=Decimal('0.5'), tool_calls=3, per='turn')"
