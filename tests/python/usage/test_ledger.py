"""kerman.usage.ledger over recorded sessions: totals computed by hand, requests that failed,
were retried, were cancelled mid-stream or were cut by a crash, each counted once."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Dict, List, Optional

import pytest

import kerman
from kerman.usage import Totals, ledger


class Recorder:
    """Builds a session's events as the log holds them (seq, time, type, data, sources)."""

    def __init__(self) -> None:
        self.events: List[Dict[str, Any]] = []
        self.turn = 0
        self.step = 0

    def add(self, type: str, data: Any, time: int, sources: Optional[List[int]] = None) -> int:
        event: Dict[str, Any] = {"type": type, "seq": len(self.events), "time": time, "data": data}
        if sources is not None:
            event["sourceEventSeqs"] = sources
        self.events.append(event)
        return event["seq"]

    def turn_start(self, turn: int, time: int) -> None:
        self.turn, self.step = turn, 0
        self.add("turn/start", {"turn": turn}, time)

    def step_start(self, step: int, time: int) -> None:
        self.step = step
        self.add("step/start", {"turn": self.turn, "step": step}, time)
        self.add("user/message", {"id": f"u{self.turn}{step}", "role": "user", "content": [{"type": "text", "text": "hi"}]}, time)

    def chunk(self, chunk: Dict[str, Any], time: int) -> int:
        return self.add("assistant/chunk", {"turn": self.turn, "step": self.step, "chunk": chunk}, time)

    def message(
        self,
        time: int,
        usage: Optional[Dict[str, Any]] = None,
        chunks: Optional[List[int]] = None,
        interrupted: bool = False,
        calls: int = 0,
    ) -> None:
        content: List[Dict[str, Any]] = [{"type": "text", "text": "ok"}]
        content += [{"type": "tool-call", "id": f"c{i}", "name": "t", "arguments": "{}"} for i in range(calls)]
        data: Dict[str, Any] = {"turn": self.turn, "step": self.step, "message": {"id": "a", "role": "assistant", "content": content}}
        if interrupted:
            data["interrupted"] = True
        if usage is not None:
            data["usage"] = usage
        self.add("assistant/message", data, time, chunks or None)

    def tool(self, call: str, time: int) -> None:
        seq = self.add("tool/call", {"turn": self.turn, "step": self.step, "callId": call, "name": "t", "arguments": "{}"}, time)
        result = {
            "id": "r" + call,
            "role": "tool",
            "content": [{"type": "tool-result", "callId": call, "content": [{"type": "text", "text": "1"}]}],
        }
        self.add("tool/result", {"turn": self.turn, "step": self.step, "message": result}, time, [seq])

    def step_end(self, time: int) -> None:
        self.add("step/end", {"turn": self.turn, "step": self.step}, time)

    def turn_end(self, kind: str, time: int) -> None:
        self.add("turn/end", {"turn": self.turn, "reason": {"kind": kind}}, time)


def usage(input: int, output: int, read: int = 0, write: int = 0, reasoning: int = 0, **extra: Any) -> Dict[str, Any]:
    return dict({"input": input, "output": output, "cacheRead": read, "cacheWrite": write, "reasoning": reasoning}, **extra)


def recorded_session() -> List[Dict[str, Any]]:
    """Four turns: a tool step then a retried streamed request; a turn cancelled mid-stream; a
    turn whose stream was cut by a crash (the store closed it on open); a turn whose two attempts
    both failed before the third succeeded."""
    r = Recorder()
    # turn 0, step 0: a non-streamed reply with two tool calls
    r.turn_start(0, 1000)
    r.step_start(0, 1000)
    r.add("request/header", {"options": {}}, 1001)
    r.message(1500, usage(1000, 100, read=600, write=100, reasoning=40), calls=2)
    r.tool("c0", 1510)
    r.tool("c1", 1520)
    r.step_end(1520)
    # turn 0, step 1: attempt 1 streams, reports partial usage and fails; attempt 2 completes
    r.step_start(1, 1600)
    r.chunk({"type": "text-delta", "text": "x"}, 1700)
    r.chunk(dict(usage(1200, 5, read=1000, partial=True), type="usage"), 1800)
    a = r.chunk({"type": "text-delta", "text": "ok"}, 2100)
    b = r.chunk(dict(usage(1200, 30, read=1000), type="usage"), 2200)
    c = r.chunk({"type": "finish", "reason": "stop"}, 2250)
    r.message(2300, usage(1200, 30, read=1000), chunks=[a, b, c])
    r.step_end(2300)
    r.turn_end("completed", 2300)
    # turn 1: cancelled mid-stream after usage was reported
    r.turn_start(1, 3000)
    r.step_start(0, 3000)
    a = r.chunk(dict(usage(400, 0), type="usage"), 3100)
    b = r.chunk({"type": "text-delta", "text": "par"}, 3200)
    r.message(3300, usage(400, 0), chunks=[a, b], interrupted=True)
    r.turn_end("aborted", 3300)
    # turn 2: the process died mid-stream; the store closed the turn on open
    r.turn_start(2, 4000)
    r.step_start(0, 4000)
    r.chunk({"type": "text-delta", "text": "lost"}, 4500)
    r.turn_end("interrupted", 4500)
    # turn 3: two attempts failed (one said how, one did not report anything), the third completed
    r.turn_start(3, 5000)
    r.step_start(0, 5000)
    r.chunk({"type": "finish", "reason": "error", "error": {"message": "boom"}}, 5100)
    r.chunk({"type": "text-delta", "text": "y"}, 5200)
    r.chunk(dict(usage(50, 2, partial=True), type="usage"), 5300)
    r.message(5600, usage(50, 7))
    r.step_end(5600)
    r.turn_end("completed", 5600)
    return r.events


def test_totals_per_request_step_turn_and_session_match_a_hand_count():
    book = ledger(recorded_session(), pricer=None)
    outcomes = [(r.turn, r.step, r.outcome, r.partial) for r in book.requests]
    assert outcomes == [
        (0, 0, "completed", False),
        (0, 1, "failed", True),
        (0, 1, "completed", False),
        (1, 0, "interrupted", True),
        (2, 0, "failed", False),
        (3, 0, "failed", False),
        (3, 0, "failed", True),
        (3, 0, "completed", False),
    ]
    # turn 0 step 0: 1000 prompt = 300 fresh + 600 read + 100 written; two tool calls
    assert book.step(0, 0) == Totals(300, 600, 100, 100, 40, requests=1, tool_calls=2, model_ms=499, cost=None, unpriced=1)
    assert book.step(0, 0).tokens == 1100 and book.step(0, 0).prompt == 1000
    # turn 0 step 1: the failed attempt's partial usage counts, once, next to the retry's
    s = book.step(0, 1)
    assert (s.input, s.cache_read, s.output, s.requests, s.failed, s.partial) == (200 + 200, 1000 + 1000, 5 + 30, 2, 1, 1)
    assert s.model_ms == (1800 - 1600) + (2300 - 1800)
    t0 = book.turn(0)
    assert (t0.input, t0.cache_read, t0.cache_write, t0.output, t0.reasoning, t0.requests, t0.tool_calls) == (700, 2600, 100, 135, 40, 3, 2)
    assert t0.tokens == 700 + 2600 + 100 + 135
    t1 = book.turn(1)
    assert (t1.input, t1.output, t1.requests, t1.partial, t1.failed) == (400, 0, 1, 1, 0)
    t2 = book.turn(2)
    assert (t2.tokens, t2.requests, t2.failed, t2.model_ms) == (0, 1, 1, 500)
    t3 = book.turn(3)
    assert (t3.input, t3.output, t3.requests, t3.failed, t3.partial) == (100, 9, 3, 2, 1)
    session = book.session
    assert (session.input, session.cache_read, session.cache_write, session.output) == (700 + 400 + 100, 2600, 100, 135 + 9)
    assert (session.requests, session.failed, session.partial, session.tool_calls) == (8, 4, 3, 2)
    assert session == sum(book.turns.values(), Totals())
    assert list(book.turns) == [0, 1, 2, 3]


def test_a_request_is_counted_once_however_its_usage_was_logged():
    # a streamed message repeats its usage chunk's numbers: the chunk is not a second request
    r = Recorder()
    r.turn_start(0, 0)
    r.step_start(0, 0)
    a = r.chunk(dict(usage(10, 3), type="usage"), 5)
    r.message(6, usage(10, 3), chunks=[a])
    r.turn_end("completed", 6)
    book = ledger(r.events, pricer=None)
    assert [(x.outcome, x.totals.input, x.totals.output) for x in book.requests] == [("completed", 10, 3)]


class FixedPricer:
    def __init__(self, price: Optional[Decimal]) -> None:
        self.price = price
        self.seen: List[Any] = []

    def __call__(self, request: Any) -> Optional[Decimal]:
        self.seen.append(request)
        return self.price


def test_costs_come_from_the_pricer_and_an_unknown_price_is_none_never_zero():
    book = ledger(recorded_session(), pricer=FixedPricer(Decimal("0.01")), model="m", provider="p")
    priced = [r for r in book.requests if r.totals.tokens]
    assert all(r.cost == Decimal("0.01") and (r.model, r.provider) == ("m", "p") for r in priced)
    # a request that reported no usage (the crashed stream, the attempt that failed silently)
    # has an unknown cost, not a free one
    assert [r.cost for r in book.requests if not r.totals.tokens] == [None, None]
    assert book.session.cost is None and book.session.unpriced == 2
    assert book.session.known_cost == Decimal("0.01") * len(priced)
    assert book.turn(0).cost == Decimal("0.03") and book.turn(2).cost is None
    unknown = ledger(recorded_session(), pricer=FixedPricer(None), model="m")
    assert unknown.session.cost is None and unknown.session.unpriced == len(book.requests)
    assert unknown.session.known_cost == 0
    assert unknown.to_dict()["session"]["costUsd"] is None


def test_the_model_option_a_request_logged_is_what_it_is_priced_as():
    r = Recorder()
    r.turn_start(0, 0)
    r.step_start(0, 0)
    r.add("request/header", {"options": {"model": "big"}}, 1)
    r.message(2, usage(10, 1))
    r.step_end(2)
    r.step_start(1, 3)
    r.add("request/header", {"options": {}}, 3)
    r.message(4, usage(10, 1))
    r.turn_end("completed", 4)
    book = ledger(r.events, pricer=FixedPricer(Decimal(1)), model="small")
    assert [x.model for x in book.requests] == ["big", "small"]


def test_bad_pricer_is_named():
    with pytest.raises(TypeError, match="pricer must be"):
        ledger([], pricer="cheap")


def test_reprs_and_json_name_the_numbers():
    book = ledger(recorded_session(), pricer=None)
    assert "8 requests (4 failed, 3 partial)" in repr(book) and "cost unknown" in repr(book)
    data = book.to_dict()
    assert data["session"]["requests"] == 8 and len(data["requests"]) == 8 and data["turns"][0]["toolCalls"] == 2
    assert "<table" in book._repr_html_()


def test_a_session_log_and_a_loop_give_the_same_ledger_as_their_events():
    async def model(request: Any) -> Any:
        return kerman.ModelReply([{"type": "text", "text": "hi"}], usage=usage(12, 3, read=2))

    import asyncio

    async def main() -> None:
        loop = kerman.AgentLoop(model)
        loop.followup("a")
        loop.followup("b")
        await loop.when_idle()
        by_log = ledger(loop.log, pricer=None)
        by_loop = ledger(loop, pricer=None)
        by_events = ledger([e.to_dict() for e in loop.log.events()], pricer=None)
        assert by_log.session == by_loop.session == by_events.session
        assert (by_log.session.requests, by_log.session.input, by_log.session.cache_read, by_log.session.output) == (2, 20, 4, 6)
        view = loop._repr_html_()  # the notebook view of the loop shows the session's usage
        assert "<th>usage</th><td>2 requests, 20 in + 4 cache read" in view
        await loop.aclose()

    asyncio.run(main())


def test_a_turn_cancelled_mid_stream_by_a_real_loop_keeps_the_usage_reported_before():
    import asyncio

    async def main() -> None:
        streaming = asyncio.Event()
        never = asyncio.Event()

        async def model(request: Any) -> Any:
            yield {"type": "usage", "input": 500, "output": 0, "cacheRead": 300}
            yield {"type": "text-delta", "text": "Hel"}
            streaming.set()
            await never.wait()

        loop = kerman.AgentLoop(model)
        loop.followup("hi")
        await streaming.wait()  # set when the loop asked for the chunk after "Hel": both are logged
        loop.cancel()
        await loop.when_idle()
        book = ledger(loop.log, pricer=None)
        [request] = book.requests
        assert (request.outcome, request.partial, request.usage) == ("interrupted", True, {"input": 500, "output": 0, "cacheRead": 300})
        assert (book.session.input, book.session.cache_read, book.session.requests, book.session.failed) == (200, 300, 1, 0)
        assert book.session.cost is None  # nothing to price with; never 0
        await loop.aclose()

    asyncio.run(main())
