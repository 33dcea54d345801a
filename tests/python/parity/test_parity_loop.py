"""Parity, part 2: AgentLoop turns with a scripted model, run against Kerman and against the
benchmarks' pure-Python baseline (the ``api`` fixture, ``--impl``; see conftest.py).

What P3 and P4 time: followup → one turn with exactly these events (SPEC 2.5, 4.3, reference
5.12), steering between steps, the pre-step decision (reject, rewrite, pass-through
``return await next()``); tool calls (P4) are in test_parity_tools.py. Only the API subset the
baseline implements is used: no live events, ``turn_stopping``, cancellation or ``ScriptedModel``.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest
from parity_helpers import (
    CLAIM_TURN,
    SPLICED,
    STEP,
    TURN,
    Minted,
    amsg,
    asynctest,
    ids,
    msg,
    records,
    same,
    scripted,
    turn_ends,
    types,
    user_texts,
)

# ---- followup: one turn --------------------------------------------------------------------


@asynctest
async def test_followup_runs_one_turn_with_exactly_these_events(api):
    model = scripted(api, api.ModelReply("hi there", usage={"outputTokens": 2}))
    loop = api.AgentLoop(model)
    assert loop.followup(api.UserMessage("hello", id="p1")).id == "p1"
    # SPEC 4.3: the turn opens and claims before followup returns; the rest runs in the driver
    assert loop.status == "running" and loop.turn == 1
    assert types(loop.log) == [SPLICED, "turn/start", SPLICED]
    await loop.when_idle()
    assert loop.status == "idle" and loop.turn == 1 and not loop.inbox.has_pending
    m = Minted()
    same(
        records(loop.log, minted=m),
        [
            {"type": SPLICED, "seq": 0, "data": {"target": TURN, "start": 0, "inserted": [msg("p1", "hello")]}},
            {"type": "turn/start", "seq": 1, "data": {"turn": 1}},
            {"type": SPLICED, "seq": 2, "data": CLAIM_TURN},
            {"type": "step/start", "seq": 3, "data": {"turn": 1, "step": 1}},
            {"type": "user/message", "seq": 4, "data": msg("p1", "hello"), "surfaceOp": "append"},
            {"type": "request/header", "seq": 5, "data": {"options": {}}},
            {
                "type": "assistant/message",
                "seq": 6,
                "data": {"turn": 1, "step": 1, "message": amsg("<m1>", "hi there"), "usage": {"outputTokens": 2}},
                "sourceEventSeqs": [],
                "surfaceOp": "append",
            },
            {"type": "step/end", "seq": 7, "data": {"turn": 1, "step": 1}},
            {"type": "turn/end", "seq": 8, "data": {"turn": 1, "reason": {"kind": "completed"}}},
        ],
    )
    same(m(model.requests), [{"turn": 1, "step": 1, "messages": [msg("p1", "hello")], "entered": ["p1"]}])


@asynctest
async def test_the_next_turn_sees_the_history_and_logs_no_second_header(api):
    model = scripted(api, "one", "two")
    loop = api.AgentLoop(model)
    loop.followup(api.UserMessage("first", id="p1"))
    await loop.when_idle()
    loop.followup(api.UserMessage("second", id="p2"))
    await loop.when_idle()
    m = Minted()
    recs = records(loop.log, minted=m)
    assert [r["type"] for r in recs[9:]] == [
        SPLICED,
        "turn/start",
        SPLICED,
        "step/start",
        "user/message",
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    same(recs[-1]["data"], {"turn": 2, "reason": {"kind": "completed"}})
    same(
        m(model.requests[1]),
        {"turn": 2, "step": 1, "messages": [msg("p1", "first"), amsg("<m1>", "one"), msg("p2", "second")], "entered": ["p2"]},
    )
    assert loop.turn == 2


BURST_TYPES = [
    SPLICED,
    "turn/start",
    SPLICED,
    SPLICED,
    SPLICED,
    "step/start",
    "user/message",
    "request/header",
    "assistant/message",
    "step/end",
    "turn/end",
] + ["turn/start", SPLICED, "step/start", "user/message", "assistant/message", "step/end", "turn/end"] * 2


@pytest.mark.parametrize("listeners", [0, 1, 5])
@asynctest
async def test_a_burst_of_followups_runs_one_turn_each_through_pass_through_listeners(api, listeners):
    """P3's shape: prompts sent in a burst, 0/1/5 pre-step listeners that only ``await next()``."""
    model = scripted(api, "a", "b", "c")
    loop = api.AgentLoop(model)
    seen: List[Any] = []

    def passthrough(k: int) -> Any:
        async def listener(step: Any, next: Any) -> Any:
            seen.append((k, step.turn, step.step, ids(step.messages), step.loop is loop))
            return await next()

        return listener

    for k in range(listeners):
        loop.pre_step(passthrough(k))
    for text in "ABC":
        loop.followup(api.UserMessage(text, id=text))
    await loop.when_idle()
    assert types(loop.log) == BURST_TYPES
    assert [e.data["inserted"][0]["id"] for e in loop.log.events(3, 5)] == ["B", "C"]
    assert user_texts(loop.log) == ["A", "B", "C"]
    assert turn_ends(loop.log) == [{"turn": t, "reason": {"kind": "completed"}} for t in (1, 2, 3)]
    assert [r["entered"] for r in model.requests] == [["A"], ["B"], ["C"]]
    assert seen == [(k, t, 1, [p], True) for t, p in zip((1, 2, 3), "ABC", strict=True) for k in range(listeners)]
    assert loop.turn == 3 and loop.status == "idle"


@asynctest
async def test_a_followup_from_inside_the_model_runs_in_the_following_turn(api):
    holder: Dict[str, Any] = {}

    def first(request: Any) -> str:
        holder["loop"].followup(api.UserMessage("callback", id="cb"))
        return "ok"

    model = scripted(api, first, "ok")
    loop = holder["loop"] = api.AgentLoop(model)
    loop.followup(api.UserMessage("outer", id="o"))
    await loop.when_idle()
    assert [(r["turn"], r["entered"]) for r in model.requests] == [(1, ["o"]), (2, ["cb"])]
    assert [e.data["turn"] for e in loop.log.events(types=["turn/start"])] == [1, 2]


# ---- steering and injected context -----------------------------------------------------------


@asynctest
async def test_steering_from_the_model_continues_the_same_turn_with_a_second_step(api):
    holder: Dict[str, Any] = {}

    def steer(request: Any) -> str:
        holder["loop"].steer(api.UserMessage("S", id="s1"))
        return "r1"

    model = scripted(api, steer, "r2")
    loop = holder["loop"] = api.AgentLoop(model)
    loop.followup(api.UserMessage("A", id="a"))
    await loop.when_idle()
    m = Minted()
    same(
        records(loop.log, 6, minted=m),
        [
            {"type": SPLICED, "seq": 6, "data": {"target": STEP, "start": 0, "inserted": [msg("s1", "S")]}},
            {
                "type": "assistant/message",
                "seq": 7,
                "data": {"turn": 1, "step": 1, "message": amsg("<m1>", "r1")},
                "sourceEventSeqs": [],
                "surfaceOp": "append",
            },
            {"type": "step/end", "seq": 8, "data": {"turn": 1, "step": 1}},
            {"type": SPLICED, "seq": 9, "data": {"target": STEP, "start": 0, "removedCount": 1, "inserted": []}},
            {"type": "step/start", "seq": 10, "data": {"turn": 1, "step": 2}},
            {"type": "user/message", "seq": 11, "data": msg("s1", "S"), "surfaceOp": "append"},
            {
                "type": "assistant/message",
                "seq": 12,
                "data": {"turn": 1, "step": 2, "message": amsg("<m2>", "r2")},
                "sourceEventSeqs": [],
                "surfaceOp": "append",
            },
            {"type": "step/end", "seq": 13, "data": {"turn": 1, "step": 2}},
            {"type": "turn/end", "seq": 14, "data": {"turn": 1, "reason": {"kind": "completed"}}},
        ],
    )
    same(m(model.requests[1]["messages"]), [msg("a", "A"), amsg("<m1>", "r1"), msg("s1", "S")])


@asynctest
async def test_steer_wakes_an_idle_loop_and_inject_does_not(api):
    model = scripted(api, "x", "y")
    loop = api.AgentLoop(model)
    loop.inject(api.UserMessage("X", id="x"))
    assert loop.status == "idle" and types(loop.log) == [SPLICED] and ids(loop.inbox.next_step) == ["x"]
    loop.steer(api.UserMessage("S", id="s"))
    assert loop.status == "running"
    await loop.when_idle()
    # one turn, one step entering both next-step messages
    assert [r["entered"] for r in model.requests] == [["x", "s"]]
    same(
        [e.data for e in loop.log.events(1, 4)],
        [
            {"target": STEP, "start": 1, "inserted": [msg("s", "S")]},
            {"turn": 1},
            {"target": STEP, "start": 0, "removedCount": 2, "inserted": []},
        ],
    )


@asynctest
async def test_injected_context_and_a_prompt_enter_together_at_the_turn_boundary(api):
    """Reference 5.12 G: claim = all of next-step, then the head of next-turn."""
    model = scripted(api, "ok")
    loop = api.AgentLoop(model)
    loop.inject(api.UserMessage("X", id="x"))
    loop.followup(api.UserMessage("P", id="p"))
    await loop.when_idle()
    same(
        records(loop.log)[2:8],
        [
            {"type": "turn/start", "seq": 2, "data": {"turn": 1}},
            {"type": SPLICED, "seq": 3, "data": {"target": STEP, "start": 0, "removedCount": 1, "inserted": []}},
            {"type": SPLICED, "seq": 4, "data": CLAIM_TURN},
            {"type": "step/start", "seq": 5, "data": {"turn": 1, "step": 1}},
            {"type": "user/message", "seq": 6, "data": msg("x", "X"), "surfaceOp": "append"},
            {"type": "user/message", "seq": 7, "data": msg("p", "P"), "surfaceOp": "append"},
        ],
    )
    assert model.requests[0]["entered"] == ["x", "p"]


# ---- the pre-step decision -------------------------------------------------------------------


@pytest.mark.parametrize("reason", [None, "secret found"])
@asynctest
async def test_a_rejecting_listener_ends_the_turn_blocked_and_stops_the_driver(api, reason):
    """Reference 5.12 E, D8; SPEC 4.9: a blocked turn stops the driver even with input pending."""
    model = scripted(api)
    loop = api.AgentLoop(model)
    later: List[Any] = []

    async def deny(step: Any, next: Any) -> Any:
        return api.Reject(reason)

    async def never(step: Any, next: Any) -> Any:
        later.append(step)
        return await next()

    loop.pre_step(deny)
    loop.pre_step(never)
    loop.followup(api.UserMessage("A", id="a"))
    loop.followup(api.UserMessage("B", id="b"))
    await loop.when_idle()
    blocked = {"kind": "blocked"} if reason is None else {"kind": "blocked", "reason": reason}
    same(
        records(loop.log)[3:],
        [
            {"type": SPLICED, "seq": 3, "data": {"target": TURN, "start": 0, "inserted": [msg("b", "B")]}},
            {"type": "turn/end", "seq": 4, "data": {"turn": 1, "reason": blocked}},
        ],
    )
    assert model.requests == [] and later == []
    assert loop.status == "idle" and ids(loop.inbox.next_turn) == ["b"]


@asynctest
async def test_a_rewriting_listener_enters_its_batch_and_only_it_reaches_the_model(api):
    model = scripted(api, "ok")
    loop = api.AgentLoop(model)

    async def rewrite(step: Any, next: Any) -> Any:
        rewritten = [api.UserMessage("REWRITTEN", source=m.source, id=m.id) for m in step.messages]
        extra = api.UserMessage("context", source={"kind": "plugin", "plugin": "guard"}, id="ctx")
        return api.Enter([*rewritten, extra, "plain"])

    loop.pre_step(rewrite)
    loop.followup(api.UserMessage("original secret", id="p"))
    await loop.when_idle()
    m = Minted()
    logged = [m(e.data) for e in loop.log.events(types=["user/message"])]
    entered = [msg("p", "REWRITTEN"), msg("ctx", "context", {"kind": "plugin", "plugin": "guard"}), msg("<m1>", "plain")]
    same(logged, entered)
    same(m(model.requests[0]["messages"]), entered)
    assert "original secret" not in json.dumps([json.loads(e.to_json()) for e in loop.log.events(3)])


@asynctest
async def test_entering_nothing_first_gives_a_completed_turn_without_a_step(api):
    model = scripted(api)
    loop = api.AgentLoop(model)

    async def drop(step: Any, next: Any) -> Any:
        return api.Enter([])

    loop.pre_step(drop)
    loop.followup(api.UserMessage("A", id="a"))
    loop.followup(api.UserMessage("B", id="b"))
    await loop.when_idle()
    assert types(loop.log) == [SPLICED, "turn/start", SPLICED, SPLICED, "turn/end"]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]
    assert model.requests == [] and ids(loop.inbox.next_turn) == ["b"] and loop.status == "idle"


@asynctest
async def test_listeners_run_in_order_share_one_payload_and_may_short_circuit(api):
    model = scripted(api, "ok", "ok")
    loop = api.AgentLoop(model)
    trace: List[Any] = []

    def listener(name: str, decide: bool = False) -> Any:
        async def fn(step: Any, next: Any) -> Any:
            trace.append((name, step.turn, ids(step.messages)))
            if name == "first":
                step.messages.append(api.UserMessage("added", id="added"))  # the default enters it
            if decide and step.turn == 2:
                return api.Enter(step.messages)
            return await next()

        return fn

    loop.pre_step(listener("second", decide=True))
    loop.pre_step(listener("third"))
    loop.pre_step(listener("first"), prepend=True)
    loop.followup(api.UserMessage("A", id="a"))
    await loop.when_idle()
    loop.followup(api.UserMessage("B", id="b"))
    await loop.when_idle()
    assert trace == [
        ("first", 1, ["a"]),
        ("second", 1, ["a", "added"]),
        ("third", 1, ["a", "added"]),
        ("first", 2, ["b"]),
        ("second", 2, ["b", "added"]),
    ]
    assert [r["entered"] for r in model.requests] == [["a", "added"], ["b", "added"]]


@asynctest
async def test_a_raising_listener_fails_the_turn_and_keeps_the_rest_queued(api):
    model = scripted(api)
    loop = api.AgentLoop(model)

    async def broken(step: Any, next: Any) -> Any:
        raise RuntimeError("prompt hook broke")

    loop.pre_step(broken)
    loop.followup(api.UserMessage("A", id="a"))
    loop.followup(api.UserMessage("B", id="b"))
    await loop.when_idle()
    same(turn_ends(loop.log), [{"turn": 1, "reason": {"kind": "error", "error": {"message": "prompt hook broke", "code": "UNKNOWN"}}}])
    assert types(loop.log)[-1] == "turn/end" and "step/start" not in types(loop.log)
    assert model.requests == [] and ids(loop.inbox.next_turn) == ["b"] and loop.status == "idle"


@pytest.mark.parametrize("returned", [None, "yes"])
@asynctest
async def test_a_listener_returning_no_decision_fails_the_turn_INVALID_DECISION(api, returned):
    """SPEC D6."""
    model = scripted(api)
    loop = api.AgentLoop(model)

    async def confused(step: Any, next: Any) -> Any:
        return returned

    loop.pre_step(confused)
    loop.followup(api.UserMessage("A", id="a"))
    await loop.when_idle()
    error = {"message": f"pre-step listener returned {returned!r}; expected Enter or Reject", "code": "INVALID_DECISION"}
    same(turn_ends(loop.log), [{"turn": 1, "reason": {"kind": "error", "error": error}}])
    assert model.requests == []


# ---- idle, resume, request options ---------------------------------------------------------


@asynctest
async def test_when_idle_on_a_fresh_loop_returns_and_nothing_runs_by_itself(api):
    model = scripted(api)
    loop = api.AgentLoop(model)
    await loop.when_idle()
    assert (loop.status, loop.turn, len(loop.log), model.requests) == ("idle", 0, 0, [])


@asynctest
async def test_a_loop_over_an_existing_log_resumes_its_turn_counter_inbox_and_history(api):
    """P8 opens a log this way: the inbox is replayed and the turn counter restored."""
    log = api.MemoryStore().create()
    first = api.AgentLoop(scripted(api, "one"), log=log)
    first.followup(api.UserMessage("first", id="p1"))
    await first.when_idle()
    first.inbox.append(TURN, api.UserMessage("queued", id="q"))
    first.inject(api.UserMessage("context", id="c"))
    if api.__name__ == "kerman":
        await first.aclose()  # a log has at most one inbox: the first loop gives it up
    n = len(log)
    model = scripted(api, "two", "three")
    loop = api.AgentLoop(model, log=log)
    assert (loop.turn, loop.status, len(log)) == (1, "idle", n)
    assert ids(loop.inbox.next_turn) == ["q"] and ids(loop.inbox.next_step) == ["c"]
    loop.followup(api.UserMessage("second", id="p2"))
    await loop.when_idle()
    m = Minted()
    history = [msg("p1", "first"), amsg("<m1>", "one"), msg("c", "context"), msg("q", "queued")]
    same(
        m(model.requests),
        [
            {"turn": 2, "step": 1, "messages": history, "entered": ["c", "q"]},
            {"turn": 3, "step": 1, "messages": [*history, amsg("<m2>", "two"), msg("p2", "second")], "entered": ["p2"]},
        ],
    )
    # a new loop instance announces its request options once (SPEC 4.7)
    assert [e.data for e in log.events(types=["request/header"])] == [{"options": {}}, {"options": {}}]
    assert loop.turn == 3 and not loop.inbox.has_pending


@asynctest
async def test_request_options_set_by_before_request_are_logged_when_they_change(api):
    model = scripted(api, "a", "b", "c")
    loop = api.AgentLoop(model)

    async def options(request: Any, next: Any) -> Any:
        if request.turn >= 2:
            request.options["temperature"] = 0
        return await next()

    loop.before_request(options)
    for text in ("A", "B", "C"):
        loop.followup(text)
        await loop.when_idle()
    headers = [(e.seq, e.data) for e in loop.log.events(types=["request/header"])]
    assert [d for _, d in headers] == [{"options": {}}, {"options": {"temperature": 0}}]
    assert headers[1][0] == [e.seq for e in loop.log.events(types=["user/message"])][1] + 1
