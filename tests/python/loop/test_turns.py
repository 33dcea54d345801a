"""AgentLoop turns and steps: delivery, the pre-step decision, continuation, scheduling
properties, canonical event sequences, waterfalls, models and tools.

Cases DEL-*, LOOP-*, PRE-*, CONT-* and PROP-* of reference-behavior.md 7.2–7.4 and 7.7, the
canonical sequences of reference 5.12 (A–G), the waterfall edge cases of reference 6.3, and
SPEC.md 2.5, 3 (D3, D6, D8) and 4.3–4.9. SPEC.md wins where it and the reference disagree.

Not here (and why): the reference's ``system-prompt/assemble`` and ``agent/request`` seams, the
runtime-context snapshot (D4; ``before_request`` replaces ``agent/request``), and
``agent/session-start`` / plugin fibers do not exist in Kerman, so PRE-19 is skipped and PRE-20
is reduced to its pre-step/``remove_listener`` part. Cancellation (CAN-*), request errors and
retries (D1), persistence and resume live in their own test files.

Every test runs its own event loop (``asyncio.run``); synchronisation uses asyncio.Event and
futures. ``spin()`` only lets already-ready callbacks run (it is used to show that something
stays pending); it never waits for time to pass.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import Any, Callable, Dict, List, Optional

import pytest

import kerman
from conftest import plain
from kerman import (
    AgentLoop,
    Enter,
    ModelError,
    ModelReply,
    ModelRequest,
    PreStep,
    Reject,
    Retry,
    Signal,
    Tool,
    ToolContext,
    ToolResult,
    ToolResultMessage,
    TurnStopping,
    UserMessage,
)
from kerman.models import EchoModel, ScriptedModel

SPLICED = "agent/inbox/spliced"
LIVE = ("agent/status", "agent/inbox/inserted", "agent/inbox/claimed", "agent/inbox/discarded", "agent/error")
BOUNDARIES = ("turn/start", "turn/end", "step/start", "step/end")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def asynctest(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Runs an ``async def`` test in a fresh event loop (pytest-asyncio is not installed)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


async def spin(times: int = 10) -> None:
    """Lets ready callbacks and tasks run ``times`` rounds. Not a timing wait."""
    for _ in range(times):
        await asyncio.sleep(0)


def call(call_id: str, name: str, args: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A tool-call content block."""
    return {"type": "tool-call", "id": call_id, "name": name, "arguments": json.dumps(args or {})}


def calls_reply(*blocks: Dict[str, Any], **kwargs: Any) -> ModelReply:
    return ModelReply(list(blocks), **kwargs)


def events(log: Any, *types: str) -> List[Any]:
    return [e for e in log.events() if not types or e.type in types]


def types_of(log: Any, *only: str) -> List[str]:
    return [e.type for e in events(log, *only)]


def boundaries(log: Any) -> List[tuple]:
    out: List[tuple] = []
    for e in events(log, *BOUNDARIES):
        if e.type.startswith("turn/"):
            out.append((e.type, e.data["turn"]))
        else:
            out.append((e.type, e.data["turn"], e.data["step"]))
    return out


def user_texts(log: Any) -> List[str]:
    return [UserMessage.from_dict(e.data).text for e in events(log, "user/message")]


def turn_ends(log: Any) -> List[dict]:
    """The ``turn/end`` payloads, without the report of a user exception (test_user_code_errors.py)."""
    return [plain(e.data) for e in events(log, "turn/end")]


def texts(request: ModelRequest) -> List[str]:
    """The text of each history message of a request (tool results as ``result:<callId>``)."""
    out = []
    for m in request.messages:
        if isinstance(m, ToolResultMessage):
            out.append(f"result:{m.call_id}")
        else:
            out.append(m.text)
    return out


def tool_result_blocks(request: ModelRequest) -> List[dict]:
    return [b for m in request.messages for b in m.content if b.get("type") == "tool-result"]


def first_index(items: List[Any], pred: Callable[[Any], bool]) -> int:
    for i, item in enumerate(items):
        if pred(item):
            return i
    raise AssertionError("no matching item")


class Recorder:
    """One trace of a loop: durable events (``log.subscribe``) and live events (``loop.on``)
    interleaved in the order they happened, redacted for snapshots: message ids become
    ``<id1>``, ``<id2>``... numbered by first appearance, and ``time`` is dropped.

    ``seams=True`` also records pass-through ``pre_step``, ``before_request`` and
    ``turn_stopping`` listeners as ``{"seam": ...}`` entries.
    """

    def __init__(self, loop: AgentLoop, seams: bool = False) -> None:
        self.loop = loop
        self.trace: List[Any] = []
        self.live: List[Any] = []
        self._ids: Dict[str, str] = {}
        loop.log.subscribe(self._durable)
        for name in LIVE:
            loop.on(name, self._on_live)
        if seams:
            loop.pre_step(self._pre_step)
            loop.before_request(self._before_request)
            loop.turn_stopping(self._turn_stopping)

    # redaction
    def _id(self, value: str) -> str:
        if value not in self._ids:
            self._ids[value] = f"<id{len(self._ids) + 1}>"
        return self._ids[value]

    def redact(self, value: Any) -> Any:
        if isinstance(value, dict):
            out = {k: self.redact(v) for k, v in value.items()}
            if "role" in value and isinstance(value.get("id"), str):
                out["id"] = self._id(value["id"])
            return out
        if isinstance(value, list):
            return [self.redact(v) for v in value]
        if isinstance(value, kerman.Message):
            return self.redact(value.to_dict())
        return value

    def _durable(self, event: Any) -> None:
        d = event.to_dict()
        d.pop("time", None)
        self.trace.append(self.redact(d))

    def _on_live(self, event: Any) -> None:
        self.live.append(event)
        entry: Dict[str, Any] = {"live": event.type}
        for key in ("status", "message", "turn", "step", "error"):
            try:
                entry[key] = self.redact(getattr(event, key))
            except AttributeError:
                pass
        self.trace.append(entry)

    async def _pre_step(self, step: PreStep, next: Any) -> Any:
        self.trace.append({"seam": "pre_step", "turn": step.turn, "step": step.step, "messages": self.redact(list(step.messages))})
        return await next()

    async def _before_request(self, request: ModelRequest, next: Any) -> Any:
        self.trace.append({"seam": "before_request", "turn": request.turn, "step": request.step})
        return await next()

    async def _turn_stopping(self, stop: TurnStopping) -> None:
        self.trace.append({"seam": "turn_stopping", "turn": stop.turn})

    def mark(self, label: str) -> None:
        self.trace.append({"mark": label})

    # accessors
    def statuses(self) -> List[str]:
        return [e.status for e in self.live if e.type == "agent/status"]

    def of(self, type: str) -> List[Any]:
        return [e for e in self.live if e.type == type]

    def index(self, pred: Callable[[Any], bool]) -> int:
        return first_index(self.trace, pred)


def msg(ref: str, text: str, source: Optional[dict] = None) -> dict:
    """A redacted user message dict, for snapshots."""
    return {"id": ref, "role": "user", "content": [{"type": "text", "text": text}], "source": source or {"kind": "user"}}


def amsg(ref: str, content: Any) -> dict:
    """A redacted assistant message dict, for snapshots."""
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    return {"id": ref, "role": "assistant", "content": content, "source": {"kind": "model"}}


# --------------------------------------------------------------------------------------------
# 7.2 Delivery, wake, and live inbox events
# --------------------------------------------------------------------------------------------


@asynctest
async def test_DEL_01_idle_inject_appends_one_event():
    model = ScriptedModel(["never"])
    loop = AgentLoop(model)
    rec = Recorder(loop)
    c = loop.inject("context C")
    assert len(loop.log) == 1
    ev = loop.log[0]
    assert ev.type == SPLICED
    assert ev.data == {"target": "next-step", "start": 0, "inserted": [c.to_dict()]}
    assert loop.status == "idle"
    await spin()
    await loop.when_idle()
    assert len(loop.log) == 1
    assert types_of(loop.log, "turn/start") == []
    assert model.requests == []
    assert rec.statuses() == []
    assert loop.inbox.next_step == (c,)
    assert [e.type for e in rec.live] == ["agent/inbox/inserted"]


@asynctest
async def test_DEL_02_inject_remove_followup_live_events():
    loop = AgentLoop(EchoModel())
    rec = Recorder(loop)
    c = loop.inject("C")
    assert loop.inbox.remove(c.id) is True
    p = loop.followup("P")
    await loop.when_idle()
    assert [e.message for e in rec.of("agent/inbox/inserted")] == [c, p]
    assert [e.message for e in rec.of("agent/inbox/discarded")] == [c]
    assert [(e.message, e.turn) for e in rec.of("agent/inbox/claimed")] == [(p, 1)]
    start = rec.index(lambda t: t.get("type") == "turn/start")
    claimed = rec.index(lambda t: t.get("live") == "agent/inbox/claimed")
    assert start < claimed
    assert user_texts(loop.log) == ["P"]


@asynctest
async def test_DEL_03_idle_steer_starts_a_turn():
    model = ScriptedModel(["ok"])
    loop = AgentLoop(model)
    s = loop.steer("S")
    assert loop.status == "running"
    await loop.when_idle()
    assert [e.data for e in events(loop.log, "user/message")] == [s.to_dict()]
    assert len(model.requests) == 1
    assert model.requests[0].entered == [s]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]


@asynctest
async def test_DEL_04_one_turn_status_events_running_idle():
    loop = AgentLoop(ScriptedModel(["ok"]))
    rec = Recorder(loop)
    loop.followup("hello")
    await loop.when_idle()
    assert rec.statuses() == ["running", "idle"]
    assert loop.status == "idle"


@asynctest
async def test_DEL_05_when_idle_without_activity_resolves_at_once():
    loop = AgentLoop(ScriptedModel([]))
    waiter = asyncio.ensure_future(loop.when_idle())
    await spin(2)
    assert waiter.done()
    await waiter
    assert loop.status == "idle"
    assert len(loop.log) == 0


@asynctest
async def test_DEL_06_when_idle_waits_for_hanging_model_until_cancel():
    entered = asyncio.Event()
    seen: List[str] = []

    async def model(request: ModelRequest) -> ModelReply:
        entered.set()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        raise AssertionError("unreachable")

    loop = AgentLoop(model)
    loop.followup("A")
    idle = asyncio.ensure_future(loop.when_idle())
    await entered.wait()
    await spin()
    assert not idle.done()
    assert loop.status == "running"
    loop.cancel({"kind": "user"})
    await idle
    assert loop.status == "idle"
    assert seen == ["cancelled"]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "user"}}}]


@asynctest
async def test_DEL_07_throwing_status_listener_is_contained(caplog):
    caplog.set_level(logging.DEBUG, logger="kerman")
    loop = AgentLoop(ScriptedModel(["ok"]))

    @loop.on("agent/status")
    def bad(event):
        raise RuntimeError(f"status listener broke on {event.status}")

    rec = Recorder(loop)  # registered after the throwing one: must still see both
    loop.followup("go")
    await loop.when_idle()
    assert rec.statuses() == ["running", "idle"]
    assert loop.status == "idle"
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]
    threw = [
        r for r in caplog.records if 'agent event "agent/status" listener' in r.getMessage() and "raised RuntimeError" in r.getMessage()
    ]
    assert len(threw) == 2


@asynctest
async def test_DEL_09_followup_whose_append_fails_raises_and_does_not_wake():
    """The failing durable append is simulated with a closed log."""
    store = kerman.MemoryStore()
    log = store.create()
    model = ScriptedModel(["never"])
    loop = AgentLoop(model, log=log)
    rec = Recorder(loop)
    log.close()
    with pytest.raises(kerman.LogError):
        loop.followup("P")
    assert not loop.inbox.has_pending
    assert loop.status == "idle"
    assert rec.statuses() == [] and rec.live == []
    await loop.when_idle()
    assert model.requests == []
    reopened = store.open(log.id)
    assert len(reopened) == 0
    reopened.close()


@asynctest
async def test_DEL_10_followup_from_log_observer_is_reentrant_and_contained():
    model = ScriptedModel(["ok", "never"])
    loop = AgentLoop(model)
    errors: List[BaseException] = []

    def observer(event):
        if event.type == SPLICED and not errors:
            try:
                loop.followup("inner")
            except BaseException as e:  # recorded, then re-raised to show containment
                errors.append(e)
                raise

    loop.log.subscribe(observer)
    loop.followup("outer")  # must not raise
    await loop.when_idle()
    assert len(errors) == 1 and isinstance(errors[0], kerman.ReentrantAppendError)
    assert user_texts(loop.log) == ["outer"]
    assert types_of(loop.log, "turn/start") == ["turn/start"]
    assert len(model.requests) == 1
    assert not loop.inbox.has_pending


@asynctest
async def test_DEL_11_second_followup_one_tick_later_gets_its_own_turn():
    loop = AgentLoop(EchoModel())
    loop.followup("A")
    await spin(1)
    loop.followup(UserMessage("B", source={"kind": "plugin", "plugin": "test"}))
    await loop.when_idle()
    assert [e.data["turn"] for e in events(loop.log, "turn/start")] == [1, 2]
    assert [e.data["source"] for e in events(loop.log, "user/message")] == [{"kind": "user"}, {"kind": "plugin", "plugin": "test"}]
    assert user_texts(loop.log) == ["A", "B"]


@asynctest
async def test_DEL_13_followup_from_inside_the_model_runs_in_a_following_turn():
    holder: Dict[str, AgentLoop] = {}
    requests: List[ModelRequest] = []

    async def model(request: ModelRequest) -> ModelReply:
        if not requests:
            holder["loop"].followup("callback")
        requests.append(request)
        return ModelReply("ok")

    loop = AgentLoop(model)
    holder["loop"] = loop
    rec = Recorder(loop)
    loop.followup("outer")
    await loop.when_idle()
    assert [e.data["turn"] for e in events(loop.log, "turn/start")] == [1, 2]
    assert user_texts(loop.log) == ["outer", "callback"]
    assert [r.turn for r in requests] == [1, 2]
    assert rec.statuses() == ["running", "idle"]


@asynctest
async def test_DEL_15_inserted_listener_removing_the_prompt_still_opens_a_no_step_turn():
    """The ACP prompt's ``cancelled`` report has no Kerman counterpart and is not tested."""
    model = ScriptedModel(["never"])
    loop = AgentLoop(model)
    removed: List[bool] = []

    @loop.on("agent/inbox/inserted")
    def remove_it(event):
        removed.append(loop.inbox.remove(event.message.id))

    rec = Recorder(loop)
    loop.followup("gone")
    await loop.when_idle()
    assert removed == [True]
    assert boundaries(loop.log) == [("turn/start", 1), ("turn/end", 1)]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]
    assert rec.statuses() == ["running", "idle"]
    assert model.requests == []
    assert not loop.inbox.has_pending


@asynctest
async def test_DEL_16_steer_from_a_concluding_tool_still_continues_the_turn():
    model = ScriptedModel([calls_reply(call("c1", "finish")), "answered the steering"])
    loop = AgentLoop(model)

    @loop.tool
    async def finish(args, ctx):
        ctx.loop.steer("late steering")
        return ToolResult("finished", concludes_turn=True)

    loop.followup("go")
    await loop.when_idle()
    assert len(model.requests) == 2
    assert len(turn_ends(loop.log)) == 1
    assert "late steering" in texts(model.requests[1])
    assert model.requests[1].entered[0].text == "late steering"
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]


@asynctest
async def test_DEL_17_durable_splices_carry_exact_messages():
    model = ScriptedModel([calls_reply(call("c1", "plan")), "done"])
    loop = AgentLoop(model)
    goal = UserMessage("keep going", source={"kind": "plugin", "plugin": "goal"})

    @loop.tool
    async def plan(args, ctx):
        ctx.loop.steer(goal)
        return "planned"

    prompt = loop.followup("the prompt")
    await loop.when_idle()
    assert prompt.source == {"kind": "user"}
    inserts = [e.data for e in loop.log.splices() if "removedCount" not in e.data]
    assert inserts == [
        {"target": "next-turn", "start": 0, "inserted": [prompt.to_dict()]},
        {"target": "next-step", "start": 0, "inserted": [goal.to_dict()]},
    ]
    steered = [e.data for e in events(loop.log, "user/message") if e.data["id"] == goal.id]
    assert steered == [goal.to_dict()]
    assert steered[0]["source"] == {"kind": "plugin", "plugin": "goal"}


# --------------------------------------------------------------------------------------------
# 7.3 Turn/step ordering and the pre-step decision
# --------------------------------------------------------------------------------------------


@asynctest
async def test_LOOP_01_simple_turn_boundaries_and_history():
    model = ScriptedModel([ModelReply("hi there", usage={"inputTokens": 3, "outputTokens": 2}), "second"])
    loop = AgentLoop(model)
    loop.followup("hello")
    await loop.when_idle()
    assert boundaries(loop.log) == [("turn/start", 1), ("step/start", 1, 1), ("step/end", 1, 1), ("turn/end", 1)]
    all_events = events(loop.log)
    assert all_events[0].type == SPLICED
    assert all_events[-1].type == "turn/end"
    assert types_of(loop.log, "user/message", "assistant/message", "tool/result") == ["user/message", "assistant/message"]
    assistant = events(loop.log, "assistant/message")[0]
    assert assistant.data["usage"] == {"inputTokens": 3, "outputTokens": 2}
    assert assistant.data["message"]["content"] == [{"type": "text", "text": "hi there"}]
    # the derived history, as the next request sees it: [user, assistant, new user]
    loop.followup("again")
    await loop.when_idle()
    history = model.requests[1].messages
    assert [(m.role, m.text) for m in history] == [("user", "hello"), ("assistant", "hi there"), ("user", "again")]


@asynctest
async def test_LOOP_02_tool_round_trip():
    model = ScriptedModel([calls_reply(call("c1", "lookup", {"q": "x"})), "final"])
    loop = AgentLoop(model)

    @loop.tool
    async def lookup(args, ctx):
        return f"found {args['q']}"

    loop.followup("go")
    await loop.when_idle()
    assert len(model.requests) == 2
    blocks = tool_result_blocks(model.requests[1])
    assert len(blocks) == 1
    assert blocks[0]["toolCallId"] == "c1"
    assert not blocks[0].get("isError", False)
    assert blocks[0]["content"] == [{"type": "text", "text": "found x"}]
    assert "tool/call" in types_of(loop.log) and "tool/result" in types_of(loop.log)
    tc = events(loop.log, "tool/call")[0]
    assert tc.data == {"turn": 1, "step": 1, "callId": "c1", "name": "lookup", "arguments": '{"q": "x"}'}
    tr = events(loop.log, "tool/result")[0]
    assert tr.source_event_seqs == [tc.seq]
    assert tr.surface_op == "append"


@asynctest
async def test_LOOP_03_raw_chunks_are_logged():
    """Kerman's chunk vocabulary has no block-start/block-end chunks (SPEC 2.5), so a
    3-character reply streamed as 3 deltas + usage + finish yields 5 ``assistant/chunk``
    events (the reference's 7 included the two block markers)."""
    chunks = [{"type": "text-delta", "text": c} for c in "abc"] + [
        {"type": "usage", "inputTokens": 1, "outputTokens": 3},
        {"type": "finish", "reason": "stop"},
    ]
    loop = AgentLoop(ScriptedModel([chunks]))
    loop.followup("go")
    await loop.when_idle()
    logged = events(loop.log, "assistant/chunk")
    assert [e.data["chunk"] for e in logged] == chunks
    assert all(e.data["turn"] == 1 and e.data["step"] == 1 for e in logged)
    assert "".join(e.data["chunk"]["text"] for e in logged if e.data["chunk"]["type"] == "text-delta") == "abc"
    message = events(loop.log, "assistant/message")[0]
    assert message.source_event_seqs == [e.seq for e in logged]
    assert message.data["message"]["content"] == [{"type": "text", "text": "abc"}]


@asynctest
async def test_LOOP_04_steering_during_a_tool_enters_after_the_second_step_start():
    model = ScriptedModel([calls_reply(call("c1", "work")), "done"])
    loop = AgentLoop(model)

    @loop.tool
    async def work(args, ctx):
        ctx.loop.steer("S")
        return "worked"

    loop.followup("go")
    await loop.when_idle()
    step_starts = events(loop.log, "step/start")
    assert [e.data for e in step_starts] == [{"turn": 1, "step": 1}, {"turn": 1, "step": 2}]
    s_event = [e for e in events(loop.log, "user/message") if UserMessage.from_dict(e.data).text == "S"]
    assert len(s_event) == 1 and s_event[0].seq > step_starts[1].seq
    assert "S" in texts(model.requests[1]) and "S" not in texts(model.requests[0])


@asynctest
async def test_PRE_01_default_next_records_the_prompt_unchanged():
    loop = AgentLoop(ScriptedModel(["ok"]))
    seen: List[str] = []

    @loop.pre_step
    async def look(step, next):
        seen.extend(m.text for m in step.messages)
        return await next()

    prompt = loop.followup("unchanged prompt")
    await loop.when_idle()
    assert seen == ["unchanged prompt"]
    assert [e.data for e in events(loop.log, "user/message")] == [prompt.to_dict()]


@asynctest
async def test_PRE_02_pre_step_coordinates_of_a_tool_turn():
    model = ScriptedModel([calls_reply(call("c1", "noop")), "done"])
    loop = AgentLoop(model)
    coords: List[tuple] = []

    @loop.tool
    async def noop(args, ctx):
        return "ok"

    @loop.pre_step
    async def look(step, next):
        coords.append((step.turn, step.step, len(step.messages), isinstance(step.signal, Signal), step.loop is loop))
        return await next()

    loop.followup("go")
    await loop.when_idle()
    assert coords == [(1, 1, 1, True, True), (1, 2, 0, True, True)]


@asynctest
async def test_PRE_03_pre_step_runs_before_step_start_and_the_request():
    model = ScriptedModel([calls_reply(call("c1", "noop")), "done"])
    loop = AgentLoop(model)
    seen: List[tuple] = []

    @loop.tool
    async def noop(args, ctx):
        return "ok"

    @loop.pre_step
    async def look(step, next):
        last = loop.log[len(loop.log) - 1].type
        opened = [e for e in events(loop.log, "step/start") if e.data == {"turn": step.turn, "step": step.step}]
        seen.append((step.step, last, len(opened), len(model.requests)))
        return await next()

    loop.followup("go")
    await loop.when_idle()
    assert seen == [(1, SPLICED, 0, 0), (2, "step/end", 0, 1)]


@asynctest
async def test_PRE_04_pre_step_messages_are_frozen_values():
    """Kerman messages are immutable values (SPEC 2.1): attribute assignment raises and
    ``content`` returns fresh copies, so mutating it cannot reach the log. Identity is not
    part of the contract (values compare by value), so only equality is checked."""
    loop = AgentLoop(ScriptedModel(["ok"]))
    given = UserMessage("input text")
    checks: List[str] = []

    @loop.pre_step
    async def look(step, next):
        m = step.messages[0]
        assert m == given
        with pytest.raises((AttributeError, TypeError)):
            m.content = [{"type": "text", "text": "mutated"}]  # type: ignore[misc]
        with pytest.raises((AttributeError, TypeError)):
            given.id = "other"  # type: ignore[misc]
        copy = m.content
        copy[0]["text"] = "mutated"
        assert m.text == "input text"
        checks.append("ok")
        return Enter([given])

    loop.followup(given)
    await loop.when_idle()
    assert checks == ["ok"]
    assert [e.data for e in events(loop.log, "user/message")] == [given.to_dict()]


@asynctest
async def test_PRE_05_rewritten_content_is_recorded_and_only_it_reaches_the_model():
    model = ScriptedModel(["ok"])
    loop = AgentLoop(model)

    @loop.pre_step
    async def rewrite(step, next):
        return Enter([m.with_content("REWRITTEN") for m in step.messages])

    prompt = loop.followup("original secret")
    await loop.when_idle()
    recorded = [e.data for e in events(loop.log, "user/message")]
    assert recorded == [{**prompt.to_dict(), "content": [{"type": "text", "text": "REWRITTEN"}]}]
    assert texts(model.requests[0]) == ["REWRITTEN"]
    assert [m.text for m in model.requests[0].entered] == ["REWRITTEN"]


@asynctest
async def test_PRE_06_extra_message_is_recorded_with_its_own_source():
    model = ScriptedModel(["ok"])
    loop = AgentLoop(model)
    extra = UserMessage("extra context", source={"kind": "plugin", "plugin": "guard"})

    @loop.pre_step
    async def add(step, next):
        return Enter([*step.messages, extra])

    prompt = loop.followup("prompt")
    await loop.when_idle()
    assert [e.data for e in events(loop.log, "user/message")] == [prompt.to_dict(), extra.to_dict()]
    assert texts(model.requests[0]) == ["prompt", "extra context"]


@asynctest
async def test_PRE_07_entering_nothing_after_a_completed_step_ends_the_turn():
    model = ScriptedModel(["first", "never"])
    loop = AgentLoop(model)
    injected: List[UserMessage] = []

    @loop.pre_step
    async def drop_later(step, next):
        if step.step >= 2:
            return Enter([])
        return await next()

    @loop.turn_stopping
    async def keep_injecting(stop):
        if len(injected) < 5:
            injected.append(stop.loop.inject(f"more {len(injected)}"))

    loop.followup("go")
    await loop.when_idle()
    assert len(model.requests) == 1
    assert types_of(loop.log, "step/start") == ["step/start"]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]
    assert len(types_of(loop.log, "turn/start")) == 1


@asynctest
async def test_PRE_08_reject_ends_the_turn_blocked_without_a_step():
    model = ScriptedModel(["never"])
    loop = AgentLoop(model)

    @loop.pre_step
    async def deny(step, next):
        return Reject()

    loop.followup("dangerous")
    await loop.when_idle()
    assert model.requests == []
    assert boundaries(loop.log) == [("turn/start", 1), ("turn/end", 1)]
    assert types_of(loop.log, "user/message", "step/start") == []
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "blocked"}}]


@asynctest
async def test_PRE_10_input_staged_while_a_rejecting_pre_step_is_pending_stays_pending():
    model = ScriptedModel(["ok"])
    loop = AgentLoop(model)
    gate = asyncio.get_running_loop().create_future()
    entered = asyncio.Event()

    @loop.pre_step
    async def guard(step, next):
        if step.turn == 1:
            entered.set()
            await gate
            return Reject()
        return await next()

    loop.followup("blocked prompt")
    await entered.wait()
    x = loop.inject("context X")
    s = loop.steer("steering S")
    gate.set_result(None)
    await loop.when_idle()
    assert boundaries(loop.log) == [("turn/start", 1), ("turn/end", 1)]
    assert turn_ends(loop.log)[0]["reason"] == {"kind": "blocked"}
    assert model.requests == []
    assert loop.inbox.next_step == (x, s)
    assert loop.inbox.next_turn == ()
    loop.followup("P")
    await loop.when_idle()
    assert len(model.requests) == 1
    assert texts(model.requests[0]) == ["context X", "steering S", "P"]


@asynctest
async def test_PRE_12_context_injected_during_a_rejected_pre_step_reaches_the_next_turn():
    model = ScriptedModel(["ok"])
    loop = AgentLoop(model)

    @loop.pre_step
    async def guard(step, next):
        if step.turn == 1:
            step.loop.inject("late context")
            return Reject("not now")
        return await next()

    loop.followup("first")
    await loop.when_idle()
    assert model.requests == []
    assert [m.text for m in loop.inbox.next_step] == ["late context"]
    loop.followup("second")
    await loop.when_idle()
    assert texts(model.requests[0]) == ["late context", "second"]


@asynctest
async def test_PRE_13_rejected_secret_leaves_safe_queued_for_a_later_wake():
    model = ScriptedModel(["ok"])
    loop = AgentLoop(model)

    @loop.pre_step
    async def guard(step, next):
        if any("secret" in m.text for m in step.messages):
            return Reject()
        return await next()

    loop.followup("secret")
    safe = loop.followup("safe")
    await loop.when_idle()
    assert boundaries(loop.log) == [("turn/start", 1), ("turn/end", 1)]
    assert model.requests == []
    assert loop.inbox.next_turn == (safe,)
    assert loop.wake() is True
    await loop.when_idle()
    assert len(model.requests) == 1
    assert "safe" in texts(model.requests[0])
    assert "secret" not in texts(model.requests[0])


@asynctest
async def test_PRE_14_throwing_pre_step_fails_the_turn_and_keeps_the_rest_queued():
    model = ScriptedModel(["never"])
    loop = AgentLoop(model)
    boom = RuntimeError("prompt hook broke")

    @loop.pre_step
    async def broken(step, next):
        raise boom

    rec = Recorder(loop)
    loop.followup("first")
    second = loop.followup("second")
    await loop.when_idle()
    errors = rec.of("agent/error")
    assert len(errors) == 1
    assert plain(errors[0].error) == {"message": "prompt hook broke", "code": "UNKNOWN"}
    assert errors[0].exception is boom
    assert errors[0].turn == 1
    assert boundaries(loop.log) == [("turn/start", 1), ("turn/end", 1)]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "error", "error": {"message": "prompt hook broke", "code": "UNKNOWN"}}}]
    assert rec.statuses() == ["running", "idle"]
    assert model.requests == []
    assert loop.inbox.next_turn == (second,)


@asynctest
async def test_PRE_15_pre_step_that_steers_then_throws():
    model = ScriptedModel(["ok"])
    loop = AgentLoop(model)
    failed: List[bool] = []

    @loop.pre_step
    async def broken(step, next):
        if not failed:
            failed.append(True)
            step.loop.steer("steering from the hook")
            raise RuntimeError("hook failed")
        return await next()

    loop.followup("first")
    await loop.when_idle()
    assert model.requests == []
    assert boundaries(loop.log) == [("turn/start", 1), ("turn/end", 1)]
    assert turn_ends(loop.log)[0]["reason"]["kind"] == "error"
    assert [m.text for m in loop.inbox.next_step] == ["steering from the hook"]
    loop.followup("second")
    await loop.when_idle()
    assert [e.data["turn"] for e in events(loop.log, "turn/start")] == [1, 2]
    assert model.requests[0].turn == 2
    assert "steering from the hook" in texts(model.requests[0])


@asynctest
async def test_PRE_16_pre_step_that_throws_once_then_the_next_prompt_runs():
    model = ScriptedModel(["ok"])
    loop = AgentLoop(model)
    rec = Recorder(loop)
    failed: List[bool] = []

    @loop.pre_step
    async def flaky(step, next):
        if not failed:
            failed.append(True)
            raise ValueError("once")
        return await next()

    loop.followup("first")
    await loop.when_idle()
    assert len(rec.of("agent/error")) == 1
    assert boundaries(loop.log) == [("turn/start", 1), ("turn/end", 1)]
    assert model.requests == []
    loop.followup("second")
    await loop.when_idle()
    assert len(model.requests) == 1
    assert turn_ends(loop.log)[1] == {"turn": 2, "reason": {"kind": "completed"}}


@asynctest
async def test_PRE_17_entering_nothing_first_gives_a_no_step_completed_turn():
    model = ScriptedModel(["never"])
    loop = AgentLoop(model)

    @loop.pre_step
    async def empty(step, next):
        return Enter([])

    loop.followup("dropped")
    await loop.when_idle()
    assert model.requests == []
    assert boundaries(loop.log) == [("turn/start", 1), ("turn/end", 1)]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]
    assert loop.inbox.next_turn == ()


@asynctest
async def test_PRE_20_guard_rejects_destructive_prompt_until_removed():
    """Reduced to what exists in Kerman: the pre-step guard and ``remove_listener``. The
    session-start inject and tools/pre-execute/post-execute parts need plugin fibers and
    ``agent/session-start`` (skipped)."""
    model = ScriptedModel(["ran"])
    loop = AgentLoop(model)

    @loop.pre_step
    async def guard(step, next):
        if any("rm -rf" in m.text for m in step.messages):
            return Reject("destructive command")
        return await next()

    loop.followup("rm -rf /")
    await loop.when_idle()
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "blocked", "reason": "destructive command"}}]
    assert types_of(loop.log, "step/start") == []
    loop.remove_listener(guard)
    loop.followup("rm -rf /")
    await loop.when_idle()
    assert len(model.requests) == 1
    assert turn_ends(loop.log)[1] == {"turn": 2, "reason": {"kind": "completed"}}


# --------------------------------------------------------------------------------------------
# 7.4 Continuation, turn-stopping, max-tokens
# --------------------------------------------------------------------------------------------


@asynctest
async def test_CONT_01_turn_stopping_steering_runs_three_steps():
    model = ScriptedModel(["one", "two", "three", "never"])
    loop = AgentLoop(model)

    @loop.turn_stopping
    async def more(stop):
        if len(events(loop.log, "step/start")) < 3:
            stop.loop.steer("continue")

    loop.followup("go")
    await loop.when_idle()
    assert len(types_of(loop.log, "step/start")) == 3
    assert len(model.requests) == 3
    assert len(types_of(loop.log, "turn/start")) == 1
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]


@asynctest
async def test_CONT_02_concluding_tool_ends_the_turn_without_another_request():
    model = ScriptedModel([calls_reply(call("c1", "finish")), "never"])
    loop = AgentLoop(model)

    @loop.tool
    async def finish(args, ctx):
        return ToolResult("all done", concludes_turn=True)

    loop.followup("go")
    await loop.when_idle()
    assert len(model.requests) == 1
    results = events(loop.log, "tool/result")
    assert len(results) == 1
    assert results[0].data["message"]["content"][0]["content"] == [{"type": "text", "text": "all done"}]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]


@asynctest
async def test_CONT_03_max_tokens_ends_the_turn_max_tokens():
    loop = AgentLoop(ScriptedModel([ModelReply("cut off", finish="max-tokens")]))
    loop.followup("go")
    await loop.when_idle()
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "max-tokens"}}]


@asynctest
async def test_CONT_05_max_tokens_does_not_leak_across_turns():
    loop = AgentLoop(ScriptedModel([ModelReply("cut", finish="max-tokens"), "fine"]))
    loop.followup("one")
    loop.followup("two")
    await loop.when_idle()
    assert [t["reason"] for t in turn_ends(loop.log)] == [{"kind": "max-tokens"}, {"kind": "completed"}]


@asynctest
async def test_CONT_06_max_tokens_tool_call_is_not_dispatched():
    model = ScriptedModel([calls_reply(call("c1", "noop"), usage={"outputTokens": 100}, finish="max-tokens"), "next"])
    loop = AgentLoop(model)
    ran: List[str] = []

    @loop.tool
    async def noop(args, ctx):
        ran.append("ran")
        return "ok"

    loop.followup("go")
    await loop.when_idle()
    assert ran == []
    assert types_of(loop.log, "tool/call", "tool/result") == []
    data = events(loop.log, "assistant/message")[0].data
    assert set(data) == {"turn", "step", "message", "usage"}
    assert (data["turn"], data["step"], data["usage"]) == (1, 1, {"outputTokens": 100})
    assert data["message"]["content"] == []
    assert data["message"]["role"] == "assistant"
    # derived history: the empty assistant message is left out
    loop.followup("again")
    await loop.when_idle()
    assert [(m.role, m.text) for m in model.requests[1].messages] == [("user", "go"), ("user", "again")]


@asynctest
async def test_CONT_08_steer_from_turn_stopping_continues_the_same_turn():
    model = ScriptedModel(["one", "two"])
    loop = AgentLoop(model)
    calls: List[int] = []

    @loop.turn_stopping
    async def once(stop):
        calls.append(stop.turn)
        if len(calls) == 1:
            stop.loop.steer("one more")

    loop.followup("go")
    await loop.when_idle()
    assert len(model.requests) == 2
    assert [r.turn for r in model.requests] == [1, 1]
    assert len(turn_ends(loop.log)) == 1
    assert calls == [1, 1]
    assert model.requests[1].entered[0].text == "one more"


@asynctest
async def test_CONT_09_inject_during_before_request_enters_at_the_next_step():
    """``before_request`` replaces the reference's ``agent/request`` waterfall (D4)."""
    model = ScriptedModel(["one", "two"])
    loop = AgentLoop(model)
    done: List[bool] = []

    @loop.before_request
    async def late(request, next):
        if not done:
            done.append(True)
            request.loop.inject("late context")
        return await next()

    loop.followup("go")
    await loop.when_idle()
    assert "late context" not in texts(model.requests[0])
    assert len(model.requests) == 2
    assert "late context" in texts(model.requests[1])
    late_event = [e for e in events(loop.log, "user/message") if UserMessage.from_dict(e.data).text == "late context"]
    step2 = [e for e in events(loop.log, "step/start") if e.data == {"turn": 1, "step": 2}]
    assert len(late_event) == 1 and len(step2) == 1 and late_event[0].seq > step2[0].seq
    assert len(types_of(loop.log, "turn/start")) == 1


@asynctest
async def test_CONT_10_additional_contexts_enter_after_all_results_in_call_order():
    model = ScriptedModel([calls_reply(call("c1", "slow"), call("c2", "fast")), "done"])
    loop = AgentLoop(model)
    fast_done = asyncio.Event()
    release_slow = asyncio.Event()
    ctx1 = UserMessage("context from slow", source={"kind": "plugin", "plugin": "slow"})
    ctx2 = UserMessage("context from fast", source={"kind": "plugin", "plugin": "fast"})

    @loop.tool
    async def slow(args, ctx):
        await release_slow.wait()
        return ToolResult("slow result", additional_contexts=[ctx1])

    @loop.tool
    async def fast(args, ctx):
        fast_done.set()
        return ToolResult("fast result", additional_contexts=[ctx2])

    loop.followup("go")
    await fast_done.wait()
    await spin()  # the fast call has finished; its result must wait for the slow one's
    assert types_of(loop.log, "tool/result") == []
    release_slow.set()
    await loop.when_idle()
    seq = [
        (
            e.type,
            e.data.get("callId")
            or (e.data["message"]["content"][0].get("toolCallId") if e.type == "tool/result" else None)
            or (e.data.get("target") if e.type == SPLICED else None)
            or (UserMessage.from_dict(e.data).text if e.type == "user/message" else None),
        )
        for e in events(loop.log)
    ]
    start = seq.index(("tool/call", "c1"))
    assert seq[start : start + 11] == [
        ("tool/call", "c1"),
        ("tool/call", "c2"),
        ("tool/result", "c1"),
        (SPLICED, "next-step"),
        ("tool/result", "c2"),
        (SPLICED, "next-step"),
        ("step/end", None),
        (SPLICED, "next-step"),
        ("step/start", None),
        ("user/message", "context from slow"),
        ("user/message", "context from fast"),
    ]
    staged = [e.data for e in loop.log.splices() if e.data["target"] == "next-step" and e.data["inserted"]]
    assert [d["inserted"] for d in staged] == [[ctx1.to_dict()], [ctx2.to_dict()]]
    assert texts(model.requests[1])[-2:] == ["context from slow", "context from fast"]


@asynctest
async def test_CONT_11_inject_inside_a_tool_body_enters_after_the_result():
    model = ScriptedModel([calls_reply(call("c1", "gather")), "done"])
    loop = AgentLoop(model)
    block = {"type": "text", "text": "first injected"}
    observed: List[Any] = []

    @loop.tool
    async def gather(args, ctx):
        ctx.loop.inject(UserMessage([block]))
        block["text"] = "mutated after inject"
        ctx.loop.inject("second injected")
        observed.append(user_texts(loop.log))
        observed.append([m.text for m in loop.inbox.next_step])
        return "gathered"

    loop.followup("go")
    await loop.when_idle()
    assert observed == [["go"], ["first injected", "second injected"]]
    assert user_texts(loop.log) == ["go", "first injected", "second injected"]
    result = events(loop.log, "tool/result")[0]
    injected = [e for e in events(loop.log, "user/message")][1:]
    assert all(e.seq > result.seq for e in injected)
    assert {e.data["turn"] for e in events(loop.log, "turn/start")} == {1}
    assert texts(model.requests[1])[-2:] == ["first injected", "second injected"]
    assert "first injected" not in texts(model.requests[0])


# --------------------------------------------------------------------------------------------
# 7.7 Scheduling properties
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 7))
@asynctest
async def test_PROP_01_burst_of_followups_one_turn_each(n):
    loop = AgentLoop(EchoModel())
    rec = Recorder(loop)
    sent = [f"prompt {i}" for i in range(n)]
    for text in sent:
        loop.followup(text)
    await loop.when_idle()
    assert user_texts(loop.log) == sent
    assert [e.data["turn"] for e in events(loop.log, "turn/start")] == list(range(1, n + 1))
    assert loop.turn == n
    per_turn = {}
    turn = 0
    for e in events(loop.log, "turn/start", "user/message"):
        if e.type == "turn/start":
            turn = e.data["turn"]
            per_turn[turn] = 0
        else:
            per_turn[turn] += 1
    assert per_turn == {t: 1 for t in range(1, n + 1)}
    assert rec.statuses() == ["running", "idle"]


@asynctest
async def test_PROP_02_sequential_followups_each_awaited():
    loop = AgentLoop(EchoModel())
    rec = Recorder(loop)
    sent = [f"message {i}" for i in range(5)]
    for text in sent:
        loop.followup(text)
        await loop.when_idle()
    assert user_texts(loop.log) == sent
    assert [e.data["turn"] for e in events(loop.log, "turn/start")] == [1, 2, 3, 4, 5]
    assert rec.statuses() == ["running", "idle"] * 5


@asynctest
async def test_PROP_04_one_signal_per_turn_shared_by_every_seam():
    """The reference's initiator scope does not exist; its counterpart is the ``loop``
    attribute of every payload. The assembly seam does not exist (D4)."""
    scripted = ScriptedModel([calls_reply(call("c1", "probe")), "turn 1 done", "turn 2 done"])
    seen: List[tuple] = []

    async def model(request: ModelRequest) -> Any:
        seen.append(("model", request.turn, request.signal, request.loop))
        return await scripted(request)

    loop = AgentLoop(model)

    @loop.pre_step
    async def ps(step, next):
        seen.append(("pre_step", step.turn, step.signal, step.loop))
        return await next()

    @loop.before_request
    async def br(request, next):
        seen.append(("before_request", request.turn, request.signal, request.loop))
        return await next()

    @loop.turn_stopping
    async def ts(stop):
        seen.append(("turn_stopping", stop.turn, stop.signal, stop.loop))

    @loop.tool
    async def probe(args, ctx):
        seen.append(("tool", ctx.turn, ctx.signal, ctx.loop))
        return "probed"

    loop.followup("one")
    loop.followup("two")
    await loop.when_idle()
    turn1 = [s for s in seen if s[1] == 1]
    turn2 = [s for s in seen if s[1] == 2]
    assert [s[0] for s in turn1] == ["pre_step", "before_request", "model", "tool", "pre_step", "before_request", "model", "turn_stopping"]
    assert [s[0] for s in turn2] == ["pre_step", "before_request", "model", "turn_stopping"]
    sig1, sig2 = turn1[0][2], turn2[0][2]
    assert isinstance(sig1, Signal) and isinstance(sig2, Signal)
    assert all(s[2] is sig1 for s in turn1)
    assert all(s[2] is sig2 for s in turn2)
    assert sig1 is not sig2
    assert all(s[3] is loop for s in seen)


# --------------------------------------------------------------------------------------------
# 5.12 Canonical event sequences (durable events, live events and seams, interleaved)
# --------------------------------------------------------------------------------------------
# Durable entries are redacted ``Event.to_dict()`` (no ``time``; message ids as <idN>), live
# entries {"live": type, fields...}, seams {"seam": name, ...}, marks {"mark": label}.
# Kerman's request/header carries {"options"} and there is no request/context, assembly seam
# or runtime-context snapshot (SPEC 4.7, D4).

A_ = msg("<id1>", "A")


@asynctest
async def test_sequence_5_12_A_idle_followup_text_answer():
    chunks = [{"type": "text-delta", "text": "Hi"}, {"type": "usage", "outputTokens": 1}, {"type": "finish", "reason": "stop"}]
    loop = AgentLoop(ScriptedModel([chunks]))
    rec = Recorder(loop, seams=True)
    loop.followup("A")
    rec.mark("followup returned")
    await loop.when_idle()
    assert rec.trace == [
        {"type": SPLICED, "seq": 0, "data": {"target": "next-turn", "start": 0, "inserted": [A_]}},
        {"live": "agent/inbox/inserted", "message": A_},
        {"live": "agent/status", "status": "running"},
        {"type": "turn/start", "seq": 1, "data": {"turn": 1}},
        {"type": SPLICED, "seq": 2, "data": {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []}},
        {"live": "agent/inbox/claimed", "message": A_, "turn": 1},
        {"mark": "followup returned"},
        {"seam": "pre_step", "turn": 1, "step": 1, "messages": [A_]},
        {"type": "step/start", "seq": 3, "data": {"turn": 1, "step": 1}},
        {"type": "user/message", "seq": 4, "data": A_, "surfaceOp": "append"},
        {"seam": "before_request", "turn": 1, "step": 1},
        {"type": "request/header", "seq": 5, "data": {"options": {}}},
        {"type": "assistant/chunk", "seq": 6, "data": {"turn": 1, "step": 1, "chunk": chunks[0]}},
        {"type": "assistant/chunk", "seq": 7, "data": {"turn": 1, "step": 1, "chunk": chunks[1]}},
        {"type": "assistant/chunk", "seq": 8, "data": {"turn": 1, "step": 1, "chunk": chunks[2]}},
        {
            "type": "assistant/message",
            "seq": 9,
            "data": {"turn": 1, "step": 1, "message": amsg("<id2>", "Hi"), "usage": {"outputTokens": 1}},
            "sourceEventSeqs": [6, 7, 8],
            "surfaceOp": "append",
        },
        {"type": "step/end", "seq": 10, "data": {"turn": 1, "step": 1}},
        {"seam": "turn_stopping", "turn": 1},
        {"type": "turn/end", "seq": 11, "data": {"turn": 1, "reason": {"kind": "completed"}}},
        {"live": "agent/status", "status": "idle"},
    ]


@asynctest
async def test_sequence_5_12_B_tool_round_trip():
    loop = AgentLoop(ScriptedModel([calls_reply(call("c1", "lookup", {"q": "x"})), "done"]))
    rec = Recorder(loop, seams=True)

    @loop.tool
    async def lookup(args, ctx):
        return "found " + args["q"]

    loop.followup("A")
    rec.mark("followup returned")
    await loop.when_idle()
    tool_call = call("c1", "lookup", {"q": "x"})
    result = {
        "id": "<id3>",
        "role": "user",
        "content": [{"type": "tool-result", "toolCallId": "c1", "content": [{"type": "text", "text": "found x"}]}],
        "source": {"kind": "tool", "callId": "c1"},
    }
    assert rec.trace == [
        {"type": SPLICED, "seq": 0, "data": {"target": "next-turn", "start": 0, "inserted": [A_]}},
        {"live": "agent/inbox/inserted", "message": A_},
        {"live": "agent/status", "status": "running"},
        {"type": "turn/start", "seq": 1, "data": {"turn": 1}},
        {"type": SPLICED, "seq": 2, "data": {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []}},
        {"live": "agent/inbox/claimed", "message": A_, "turn": 1},
        {"mark": "followup returned"},
        {"seam": "pre_step", "turn": 1, "step": 1, "messages": [A_]},
        {"type": "step/start", "seq": 3, "data": {"turn": 1, "step": 1}},
        {"type": "user/message", "seq": 4, "data": A_, "surfaceOp": "append"},
        {"seam": "before_request", "turn": 1, "step": 1},
        {"type": "request/header", "seq": 5, "data": {"options": {}}},
        {
            "type": "assistant/message",
            "seq": 6,
            "data": {"turn": 1, "step": 1, "message": amsg("<id2>", [tool_call])},
            "sourceEventSeqs": [],
            "surfaceOp": "append",
        },
        {"type": "tool/call", "seq": 7, "data": {"turn": 1, "step": 1, "callId": "c1", "name": "lookup", "arguments": '{"q": "x"}'}},
        {"type": "tool/result", "seq": 8, "data": {"turn": 1, "step": 1, "message": result}, "sourceEventSeqs": [7], "surfaceOp": "append"},
        {"type": "step/end", "seq": 9, "data": {"turn": 1, "step": 1}},
        {"seam": "pre_step", "turn": 1, "step": 2, "messages": []},
        {"type": "step/start", "seq": 10, "data": {"turn": 1, "step": 2}},
        {"seam": "before_request", "turn": 1, "step": 2},
        {
            "type": "assistant/message",
            "seq": 11,
            "data": {"turn": 1, "step": 2, "message": amsg("<id4>", "done")},
            "sourceEventSeqs": [],
            "surfaceOp": "append",
        },
        {"type": "step/end", "seq": 12, "data": {"turn": 1, "step": 2}},
        {"seam": "turn_stopping", "turn": 1},
        {"type": "turn/end", "seq": 13, "data": {"turn": 1, "reason": {"kind": "completed"}}},
        {"live": "agent/status", "status": "idle"},
    ]


@asynctest
async def test_sequence_5_12_C_steering_between_steps():
    loop = AgentLoop(ScriptedModel([calls_reply(call("c1", "work")), "done"]))
    rec = Recorder(loop, seams=True)

    @loop.tool
    async def work(args, ctx):
        ctx.loop.steer("S")
        return "ok"

    loop.followup("A")
    await loop.when_idle()
    S_ = msg("<id3>", "S")
    result = {
        "id": "<id4>",
        "role": "user",
        "content": [{"type": "tool-result", "toolCallId": "c1", "content": [{"type": "text", "text": "ok"}]}],
        "source": {"kind": "tool", "callId": "c1"},
    }
    start = rec.index(lambda t: t.get("type") == "tool/call")
    assert rec.trace[start:] == [
        {"type": "tool/call", "seq": 7, "data": {"turn": 1, "step": 1, "callId": "c1", "name": "work", "arguments": "{}"}},
        {"type": SPLICED, "seq": 8, "data": {"target": "next-step", "start": 0, "inserted": [S_]}},
        {"live": "agent/inbox/inserted", "message": S_},
        {"type": "tool/result", "seq": 9, "data": {"turn": 1, "step": 1, "message": result}, "sourceEventSeqs": [7], "surfaceOp": "append"},
        {"type": "step/end", "seq": 10, "data": {"turn": 1, "step": 1}},
        {"type": SPLICED, "seq": 11, "data": {"target": "next-step", "start": 0, "removedCount": 1, "inserted": []}},
        {"live": "agent/inbox/claimed", "message": S_, "turn": 1},
        {"seam": "pre_step", "turn": 1, "step": 2, "messages": [S_]},
        {"type": "step/start", "seq": 12, "data": {"turn": 1, "step": 2}},
        {"type": "user/message", "seq": 13, "data": S_, "surfaceOp": "append"},
        {"seam": "before_request", "turn": 1, "step": 2},
        {
            "type": "assistant/message",
            "seq": 14,
            "data": {"turn": 1, "step": 2, "message": amsg("<id5>", "done")},
            "sourceEventSeqs": [],
            "surfaceOp": "append",
        },
        {"type": "step/end", "seq": 15, "data": {"turn": 1, "step": 2}},
        {"seam": "turn_stopping", "turn": 1},
        {"type": "turn/end", "seq": 16, "data": {"turn": 1, "reason": {"kind": "completed"}}},
        {"live": "agent/status", "status": "idle"},
    ]


@asynctest
async def test_sequence_5_12_D_burst_while_idle():
    loop = AgentLoop(EchoModel())
    rec = Recorder(loop)
    loop.followup("A")
    loop.followup("B")
    loop.followup("C")
    rec.mark("followups returned")
    await loop.when_idle()
    B_, C_ = msg("<id2>", "B"), msg("<id3>", "C")
    claim = {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []}

    assert rec.trace == [
        {"type": SPLICED, "seq": 0, "data": {"target": "next-turn", "start": 0, "inserted": [A_]}},
        {"live": "agent/inbox/inserted", "message": A_},
        {"live": "agent/status", "status": "running"},
        {"type": "turn/start", "seq": 1, "data": {"turn": 1}},
        {"type": SPLICED, "seq": 2, "data": claim},
        {"live": "agent/inbox/claimed", "message": A_, "turn": 1},
        {"type": SPLICED, "seq": 3, "data": {"target": "next-turn", "start": 0, "inserted": [B_]}},
        {"live": "agent/inbox/inserted", "message": B_},
        {"type": SPLICED, "seq": 4, "data": {"target": "next-turn", "start": 1, "inserted": [C_]}},
        {"live": "agent/inbox/inserted", "message": C_},
        {"mark": "followups returned"},
        {"type": "step/start", "seq": 5, "data": {"turn": 1, "step": 1}},
        {"type": "user/message", "seq": 6, "data": A_, "surfaceOp": "append"},
        {"type": "request/header", "seq": 7, "data": {"options": {}}},
        {
            "type": "assistant/message",
            "seq": 8,
            "data": {"turn": 1, "step": 1, "message": amsg("<id4>", "A")},
            "sourceEventSeqs": [],
            "surfaceOp": "append",
        },
        {"type": "step/end", "seq": 9, "data": {"turn": 1, "step": 1}},
        {"type": "turn/end", "seq": 10, "data": {"turn": 1, "reason": {"kind": "completed"}}},
        {"type": "turn/start", "seq": 11, "data": {"turn": 2}},
        {"type": SPLICED, "seq": 12, "data": claim},
        {"live": "agent/inbox/claimed", "message": B_, "turn": 2},
        {"type": "step/start", "seq": 13, "data": {"turn": 2, "step": 1}},
        {"type": "user/message", "seq": 14, "data": B_, "surfaceOp": "append"},
        {
            "type": "assistant/message",
            "seq": 15,
            "data": {"turn": 2, "step": 1, "message": amsg("<id5>", "B")},
            "sourceEventSeqs": [],
            "surfaceOp": "append",
        },
        {"type": "step/end", "seq": 16, "data": {"turn": 2, "step": 1}},
        {"type": "turn/end", "seq": 17, "data": {"turn": 2, "reason": {"kind": "completed"}}},
        {"type": "turn/start", "seq": 18, "data": {"turn": 3}},
        {"type": SPLICED, "seq": 19, "data": claim},
        {"live": "agent/inbox/claimed", "message": C_, "turn": 3},
        {"type": "step/start", "seq": 20, "data": {"turn": 3, "step": 1}},
        {"type": "user/message", "seq": 21, "data": C_, "surfaceOp": "append"},
        {
            "type": "assistant/message",
            "seq": 22,
            "data": {"turn": 3, "step": 1, "message": amsg("<id6>", "C")},
            "sourceEventSeqs": [],
            "surfaceOp": "append",
        },
        {"type": "step/end", "seq": 23, "data": {"turn": 3, "step": 1}},
        {"type": "turn/end", "seq": 24, "data": {"turn": 3, "reason": {"kind": "completed"}}},
        {"live": "agent/status", "status": "idle"},
    ]


@asynctest
async def test_sequence_5_12_E_rejection():
    model = ScriptedModel(["never"])
    loop = AgentLoop(model)
    rec = Recorder(loop, seams=True)

    @loop.pre_step
    async def deny(step, next):
        return Reject()

    loop.followup("A")
    loop.followup("B")
    rec.mark("followups returned")
    await loop.when_idle()
    B_ = msg("<id2>", "B")
    assert rec.trace == [
        {"type": SPLICED, "seq": 0, "data": {"target": "next-turn", "start": 0, "inserted": [A_]}},
        {"live": "agent/inbox/inserted", "message": A_},
        {"live": "agent/status", "status": "running"},
        {"type": "turn/start", "seq": 1, "data": {"turn": 1}},
        {"type": SPLICED, "seq": 2, "data": {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []}},
        {"live": "agent/inbox/claimed", "message": A_, "turn": 1},
        {"type": SPLICED, "seq": 3, "data": {"target": "next-turn", "start": 0, "inserted": [B_]}},
        {"live": "agent/inbox/inserted", "message": B_},
        {"mark": "followups returned"},
        {"seam": "pre_step", "turn": 1, "step": 1, "messages": [A_]},
        {"type": "turn/end", "seq": 4, "data": {"turn": 1, "reason": {"kind": "blocked"}}},
        {"live": "agent/status", "status": "idle"},
    ]
    assert model.requests == []
    assert [m.text for m in loop.inbox.next_turn] == ["B"]


@asynctest
async def test_sequence_5_12_F_throwing_pre_step():
    """``agent/error`` is emitted before ``turn/end``: reference 5.5 reports the failure
    (step 5) before the ``finally`` that appends ``turn/end`` (step 6); 5.12 F only lists them."""
    model = ScriptedModel(["never"])
    loop = AgentLoop(model)
    rec = Recorder(loop)

    @loop.pre_step
    async def broken(step, next):
        raise RuntimeError("prompt hook broke")

    loop.followup("A")
    loop.followup("B")
    rec.mark("followups returned")
    await loop.when_idle()
    B_ = msg("<id2>", "B")
    failure = {"message": "prompt hook broke", "code": "UNKNOWN"}
    assert plain(rec.trace) == [
        {"type": SPLICED, "seq": 0, "data": {"target": "next-turn", "start": 0, "inserted": [A_]}},
        {"live": "agent/inbox/inserted", "message": A_},
        {"live": "agent/status", "status": "running"},
        {"type": "turn/start", "seq": 1, "data": {"turn": 1}},
        {"type": SPLICED, "seq": 2, "data": {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []}},
        {"live": "agent/inbox/claimed", "message": A_, "turn": 1},
        {"type": SPLICED, "seq": 3, "data": {"target": "next-turn", "start": 0, "inserted": [B_]}},
        {"live": "agent/inbox/inserted", "message": B_},
        {"mark": "followups returned"},
        {"live": "agent/error", "turn": 1, "step": 0, "error": failure},
        {"type": "turn/end", "seq": 4, "data": {"turn": 1, "reason": {"kind": "error", "error": failure}}},
        {"live": "agent/status", "status": "idle"},
    ]
    assert model.requests == []
    assert [m.text for m in loop.inbox.next_turn] == ["B"]


@asynctest
async def test_sequence_5_12_G_batch_composition_at_a_turn_boundary():
    loop = AgentLoop(EchoModel())
    rec = Recorder(loop)
    loop.inject("X")
    loop.followup("P")
    rec.mark("followup returned")
    await loop.when_idle()
    # inject(str) gives the message a context source, not a human's (what UIs label it by).
    X_, P_ = msg("<id1>", "X", {"kind": "context"}), msg("<id2>", "P")
    assert rec.trace == [
        {"type": SPLICED, "seq": 0, "data": {"target": "next-step", "start": 0, "inserted": [X_]}},
        {"live": "agent/inbox/inserted", "message": X_},
        {"type": SPLICED, "seq": 1, "data": {"target": "next-turn", "start": 0, "inserted": [P_]}},
        {"live": "agent/inbox/inserted", "message": P_},
        {"live": "agent/status", "status": "running"},
        {"type": "turn/start", "seq": 2, "data": {"turn": 1}},
        {"type": SPLICED, "seq": 3, "data": {"target": "next-step", "start": 0, "removedCount": 1, "inserted": []}},
        {"type": SPLICED, "seq": 4, "data": {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []}},
        {"live": "agent/inbox/claimed", "message": X_, "turn": 1},
        {"live": "agent/inbox/claimed", "message": P_, "turn": 1},
        {"mark": "followup returned"},
        {"type": "step/start", "seq": 5, "data": {"turn": 1, "step": 1}},
        {"type": "user/message", "seq": 6, "data": X_, "surfaceOp": "append"},
        {"type": "user/message", "seq": 7, "data": P_, "surfaceOp": "append"},
        {"type": "request/header", "seq": 8, "data": {"options": {}}},
        {
            "type": "assistant/message",
            "seq": 9,
            "data": {"turn": 1, "step": 1, "message": amsg("<id3>", "X\nP")},
            "sourceEventSeqs": [],
            "surfaceOp": "append",
        },
        {"type": "step/end", "seq": 10, "data": {"turn": 1, "step": 1}},
        {"type": "turn/end", "seq": 11, "data": {"turn": 1, "reason": {"kind": "completed"}}},
        {"live": "agent/status", "status": "idle"},
    ]


# --------------------------------------------------------------------------------------------
# Registration: decorators, prepend, remove_listener (SPEC 2.5, reference 6.1)
# --------------------------------------------------------------------------------------------


@asynctest
async def test_decorators_return_the_function_and_prepend_inserts_first():
    model = ScriptedModel([calls_reply(call("c1", "t")), "done"])
    loop = AgentLoop(model)
    order: List[str] = []

    async def pre_a(step, next):
        order.append("pre_a")
        return await next()

    async def pre_b(step, next):
        order.append("pre_b")
        return await next()

    async def req_a(request, next):
        order.append("req_a")
        return await next()

    async def req_b(request, next):
        order.append("req_b")
        return await next()

    async def stop_a(stop):
        order.append("stop_a")

    async def stop_b(stop):
        order.append("stop_b")

    def status_a(event):
        order.append(f"status_a:{event.status}")

    def status_b(event):
        order.append(f"status_b:{event.status}")

    async def t(args, ctx):
        return "ok"

    assert loop.pre_step(pre_a) is pre_a
    assert loop.pre_step(prepend=True)(pre_b) is pre_b
    assert loop.before_request(req_a) is req_a
    assert loop.before_request(req_b, prepend=True) is req_b
    assert loop.turn_stopping(stop_a) is stop_a
    assert loop.turn_stopping(prepend=True)(stop_b) is stop_b
    assert loop.on("agent/status", status_a) is status_a
    assert loop.on("agent/status", prepend=True)(status_b) is status_b
    assert loop.tool(t) is t
    loop.followup("go")
    await loop.when_idle()
    assert order == [
        "status_b:running",
        "status_a:running",
        "pre_b",
        "pre_a",
        "req_b",
        "req_a",  # step 1
        "pre_b",
        "pre_a",
        "req_b",
        "req_a",  # step 2 (tool continuation)
        "stop_b",
        "stop_a",
        "status_b:idle",
        "status_a:idle",
    ]


@asynctest
async def test_remove_listener_unregisters_from_every_seam():
    model = ScriptedModel(["one", "two"])
    loop = AgentLoop(model)
    calls: List[str] = []

    async def pre(step, next):
        calls.append("pre")
        return await next()

    async def req(request, next):
        calls.append("req")
        return await next()

    async def stop(stop):
        calls.append("stop")

    def status(event):
        calls.append("status")

    loop.pre_step(pre)
    loop.before_request(req)
    loop.turn_stopping(stop)
    loop.on("agent/status", status)
    loop.followup("one")
    await loop.when_idle()
    assert calls == ["status", "pre", "req", "stop", "status"]
    calls.clear()
    for fn in (pre, req, stop, status):
        loop.remove_listener(fn)
    loop.followup("two")
    await loop.when_idle()
    assert calls == []
    assert len(model.requests) == 2
    assert turn_ends(loop.log)[1]["reason"] == {"kind": "completed"}


# --------------------------------------------------------------------------------------------
# Waterfall edge cases (reference 6.3)
# --------------------------------------------------------------------------------------------


@asynctest
async def test_waterfall_listener_not_calling_next_short_circuits():
    loop = AgentLoop(ScriptedModel(["ok"]))
    later: List[str] = []

    @loop.pre_step
    async def veto(step, next):
        return Enter([m.with_content("short-circuited") for m in step.messages])

    @loop.pre_step
    async def never(step, next):
        later.append("called")
        return await next()

    loop.followup("original")
    await loop.when_idle()
    assert later == []
    assert user_texts(loop.log) == ["short-circuited"]


@asynctest
async def test_waterfall_listener_replaces_the_downstream_result():
    loop = AgentLoop(ScriptedModel(["ok"]))

    @loop.pre_step
    async def outer(step, next):
        downstream = await next()
        assert isinstance(downstream, Enter) and [m.text for m in downstream.messages] == ["inner"]
        return Enter([m.with_content("outer") for m in downstream.messages])

    @loop.pre_step
    async def inner(step, next):
        return Enter([m.with_content("inner") for m in step.messages])

    loop.followup("original")
    await loop.when_idle()
    assert user_texts(loop.log) == ["outer"]


@asynctest
async def test_waterfall_next_twice_pulls_the_next_remaining_listener_then_the_default():
    loop = AgentLoop(ScriptedModel(["ok", "ok"]))
    calls: List[str] = []

    @loop.pre_step
    async def l1(step, next):
        calls.append("l1")
        first = await next()  # runs l2 (whose next() runs the default)
        second = await next()  # the queue is empty: runs the default directly
        calls.append(f"l1 got {[m.text for m in first.messages]} then {[m.text for m in second.messages]}")
        return second

    @loop.pre_step
    async def l2(step, next):
        calls.append("l2")
        await next()
        return Enter([m.with_content("from l2") for m in step.messages])

    loop.followup("prompt")
    await loop.when_idle()
    assert calls == ["l1", "l2", "l1 got ['from l2'] then ['prompt']"]
    assert user_texts(loop.log) == ["prompt"]


@asynctest
async def test_waterfall_last_listener_calling_next_twice_runs_the_default_twice():
    loop = AgentLoop(ScriptedModel(["ok"]))
    results: List[List[str]] = []

    @loop.pre_step
    async def twice(step, next):
        first = await next()
        # the default reads the shared payload at call time: show it really ran again
        step.messages = [m.with_content("changed before second next") for m in step.messages]
        second = await next()
        results.append([m.text for m in first.messages])
        results.append([m.text for m in second.messages])
        return second

    loop.followup("prompt")
    await loop.when_idle()
    assert results == [["prompt"], ["changed before second next"]]
    assert user_texts(loop.log) == ["changed before second next"]


@asynctest
async def test_waterfall_listeners_share_one_payload_object():
    loop = AgentLoop(ScriptedModel(["ok"]))
    extra = UserMessage("added by l1", source={"kind": "plugin", "plugin": "l1"})
    payloads: List[Any] = []

    @loop.pre_step
    async def l1(step, next):
        payloads.append(step)
        step.messages.append(extra)  # visible downstream and to the default
        return await next()

    @loop.pre_step
    async def l2(step, next):
        payloads.append(step)
        assert step.messages[-1] == extra
        return await next()

    @loop.before_request
    async def r1(request, next):
        payloads.append(request)
        request.options["shared"] = True
        return await next()

    @loop.before_request
    async def r2(request, next):
        payloads.append(request)
        assert request.options == {"shared": True}
        return await next()

    loop.followup("prompt")
    await loop.when_idle()
    assert payloads[0] is payloads[1]
    assert payloads[2] is payloads[3]
    assert user_texts(loop.log) == ["prompt", "added by l1"]
    assert [e.data for e in events(loop.log, "request/header")] == [{"options": {"shared": True}}]


@asynctest
async def test_waterfall_sync_listeners_are_allowed():
    model = ScriptedModel(["ok", "never"])
    loop = AgentLoop(model)

    @loop.pre_step
    def sync_pass(step, next):
        return next()  # an awaitable: the loop awaits it

    @loop.pre_step
    def sync_decide(step, next):
        if step.turn == 2:
            return Reject("sync says no")
        return Enter([m.with_content(m.text.upper()) for m in step.messages])

    @loop.before_request
    def sync_request(request, next):
        request.options["sync"] = 1
        return request

    @loop.turn_stopping
    def sync_stop(stop):
        return None

    loop.followup("shout")
    await loop.when_idle()
    loop.followup("second")
    await loop.when_idle()
    assert user_texts(loop.log) == ["SHOUT"]
    assert [e.data for e in events(loop.log, "request/header")] == [{"options": {"sync": 1}}]
    assert [t["reason"] for t in turn_ends(loop.log)] == [{"kind": "completed"}, {"kind": "blocked", "reason": "sync says no"}]


# --------------------------------------------------------------------------------------------
# Decisions D3, D6, D8 and plain-dict decisions
# --------------------------------------------------------------------------------------------


@asynctest
async def test_D6_pre_step_listener_returning_None_fails_the_turn():
    """D6 changes reference 10.16 (a TypeError flattened to UNKNOWN)."""
    model = ScriptedModel(["never"])
    loop = AgentLoop(model)
    rec = Recorder(loop)

    @loop.pre_step
    async def forgot(step, next):
        await next()  # forgets to return it

    loop.followup("go")
    await loop.when_idle()
    failure = {"message": "pre-step listener returned None; expected Enter or Reject", "code": "INVALID_DECISION"}
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "error", "error": failure}}]
    assert [e.error for e in rec.of("agent/error")] == [failure]
    assert model.requests == []
    assert types_of(loop.log, "step/start") == []


@asynctest
async def test_D6_non_decision_values_fail_with_their_repr():
    model = ScriptedModel(["never"])
    loop = AgentLoop(model)
    values = iter([42, "enter", {"kind": "maybe"}])

    @loop.pre_step
    async def odd(step, next):
        return _next_value(values)  # ``next`` is the waterfall's here

    for _ in range(3):
        loop.followup("go")
        await loop.when_idle()
    reasons = [t["reason"] for t in turn_ends(loop.log)]
    assert reasons == [
        {"kind": "error", "error": {"message": f"pre-step listener returned {v!r}; expected Enter or Reject", "code": "INVALID_DECISION"}}
        for v in (42, "enter", {"kind": "maybe"})
    ]
    assert model.requests == []


def _next_value(it: Any) -> Any:
    return next(it)


@asynctest
async def test_D8_reject_reason_is_recorded_and_absent_without_one():
    """D8: the reference records only ``{kind: "blocked"}``."""
    loop = AgentLoop(ScriptedModel(["never"]))
    decisions = iter([Reject("why"), Reject(), {"kind": "reject", "reason": "dict why"}, {"kind": "reject"}])

    @loop.pre_step
    async def deny(step, next):
        return _next_value(decisions)

    for _ in range(4):
        loop.followup("go")
        await loop.when_idle()
    assert turn_ends(loop.log) == [
        {"turn": 1, "reason": {"kind": "blocked", "reason": "why"}},
        {"turn": 2, "reason": {"kind": "blocked"}},
        {"turn": 3, "reason": {"kind": "blocked", "reason": "dict why"}},
        {"turn": 4, "reason": {"kind": "blocked"}},
    ]


@asynctest
async def test_D8_non_string_reject_reason_is_an_invalid_decision():
    loop = AgentLoop(ScriptedModel(["never"]))

    @loop.pre_step
    async def deny(step, next):
        return Reject(42)  # type: ignore[arg-type]

    loop.followup("go")
    await loop.when_idle()
    (end,) = turn_ends(loop.log)
    assert end["reason"]["kind"] == "error"
    assert end["reason"]["error"]["code"] == "INVALID_DECISION"


@asynctest
async def test_plain_dict_enter_decision_is_accepted():
    model = ScriptedModel(["ok"])
    loop = AgentLoop(model)
    extra = UserMessage("dict extra", source={"kind": "plugin", "plugin": "d"})

    @loop.pre_step
    async def as_dict(step, next):
        decision = await next()
        assert decision.kind == "enter"
        return {"kind": "enter", "messages": [*step.messages, extra]}

    loop.followup("prompt")
    await loop.when_idle()
    assert user_texts(loop.log) == ["prompt", "dict extra"]
    assert len(model.requests) == 1


@asynctest
async def test_D3_max_tokens_is_sticky_only_as_the_end_reason():
    """D3 changes reference 10.8: a later step's tool calls still get their follow-up request."""
    model = ScriptedModel(
        [
            ModelReply("cut off", finish="max-tokens"),
            calls_reply(call("c1", "probe")),
            "after the tool",
        ]
    )
    loop = AgentLoop(model)
    steered: List[bool] = []

    @loop.turn_stopping
    async def keep_going(stop):
        if not steered:
            steered.append(True)
            stop.loop.steer("continue please")

    @loop.tool
    async def probe(args, ctx):
        return "probed"

    loop.followup("go")
    await loop.when_idle()
    assert len(model.requests) == 3
    assert [(r.turn, r.step) for r in model.requests] == [(1, 1), (1, 2), (1, 3)]
    assert [b["toolCallId"] for b in tool_result_blocks(model.requests[2])] == ["c1"]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "max-tokens"}}]


# --------------------------------------------------------------------------------------------
# Models: ModelRequest.entered, EchoModel, ScriptedModel (SPEC 4.9), request/header (SPEC 4.7)
# --------------------------------------------------------------------------------------------


@asynctest
async def test_model_request_entered_lists_this_steps_user_messages():
    scripted = ScriptedModel([calls_reply(call("c1", "plain")), calls_reply(call("c2", "steerer")), "done"])
    seen: List[tuple] = []

    async def model(request: ModelRequest) -> Any:
        assert all(isinstance(m, UserMessage) for m in request.entered)
        seen.append((request.step, [m.text for m in request.entered]))
        return await scripted(request)

    loop = AgentLoop(model)

    @loop.tool
    async def plain(args, ctx):
        return "plain"

    @loop.tool
    async def steerer(args, ctx):
        ctx.loop.steer("S")
        return "steered"

    x = loop.inject("X")
    loop.followup("P")
    await loop.when_idle()
    assert seen == [(1, ["X", "P"]), (2, []), (3, ["S"])]
    assert x.text == "X"


@asynctest
async def test_echo_model_replies_with_the_entered_texts():
    loop = AgentLoop(EchoModel())
    loop.inject("line one")
    loop.followup("line two")
    await loop.when_idle()
    loop.followup("solo")
    await loop.when_idle()
    replies = [e.data["message"]["content"] for e in events(loop.log, "assistant/message")]
    assert replies == [[{"type": "text", "text": "line one\nline two"}], [{"type": "text", "text": "solo"}]]


@asynctest
async def test_scripted_model_reply_items_str_and_model_reply():
    model = ScriptedModel(
        ["plain text", ModelReply([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], usage={"outputTokens": 7})]
    )
    loop = AgentLoop(model)
    loop.followup("one")
    loop.followup("two")
    await loop.when_idle()
    data = [e.data for e in events(loop.log, "assistant/message")]
    assert data[0]["message"]["content"] == [{"type": "text", "text": "plain text"}]
    assert "usage" not in data[0]
    assert data[1]["message"]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert data[1]["usage"] == {"outputTokens": 7}
    assert [e.source_event_seqs for e in events(loop.log, "assistant/message")] == [[], []]
    assert types_of(loop.log, "assistant/chunk") == []
    assert [r.turn for r in model.requests] == [1, 2]


@asynctest
async def test_scripted_model_chunk_list_is_streamed_and_cited():
    chunks = [
        {"type": "reasoning-delta", "text": "thinking"},
        {"type": "text-delta", "text": "Hel"},
        {"type": "text-delta", "text": "lo"},
        {"type": "tool-call", "id": "c1", "name": "noop", "arguments": "{}"},
        {"type": "usage", "outputTokens": 5},
        {"type": "finish", "reason": "stop"},
    ]
    model = ScriptedModel([chunks, "after"])
    loop = AgentLoop(model)

    @loop.tool
    async def noop(args, ctx):
        return "ok"

    loop.followup("go")
    await loop.when_idle()
    chunk_events = events(loop.log, "assistant/chunk")
    assert [e.data for e in chunk_events] == [{"turn": 1, "step": 1, "chunk": c} for c in chunks]
    first = events(loop.log, "assistant/message")[0]
    assert first.source_event_seqs == [e.seq for e in chunk_events]
    assert first.surface_op == "append"
    assert first.data["message"]["content"] == [
        {"type": "reasoning", "text": "thinking"},
        {"type": "text", "text": "Hello"},
        {"type": "tool-call", "id": "c1", "name": "noop", "arguments": "{}"},
    ]
    assert first.data["usage"] == {"outputTokens": 5}
    assert [e.data["callId"] for e in events(loop.log, "tool/call")] == ["c1"]
    assert len(model.requests) == 2


@asynctest
async def test_scripted_model_exception_item_is_raised():
    err = ModelError("rate limited", code="RATE_LIMIT", status=429)
    model = ScriptedModel([err, "recovered", RuntimeError("model crashed")])
    loop = AgentLoop(model)
    failures: List[Any] = []

    @loop.request_error
    async def retry_once(failure, next):
        failures.append(failure)
        return Retry() if len(failures) == 1 else await next()

    loop.followup("one")
    await loop.when_idle()
    assert len(failures) == 1
    assert failures[0].exception is err
    assert plain(failures[0].failure) == {"message": "rate limited", "code": "RATE_LIMIT", "status": 429}
    assert turn_ends(loop.log)[0] == {"turn": 1, "reason": {"kind": "completed"}}
    assert len(types_of(loop.log, "step/start")) == 1  # the retry stays in the step (D1)
    loop.followup("two")
    await loop.when_idle()
    assert turn_ends(loop.log)[1] == {"turn": 2, "reason": {"kind": "error", "error": {"message": "model crashed", "code": "UNKNOWN"}}}


@asynctest
async def test_scripted_model_exhausted_raises_model_error():
    model = ScriptedModel([])
    loop = AgentLoop(model)
    rec = Recorder(loop)
    loop.followup("go")
    await loop.when_idle()
    failure = {"message": "script exhausted", "code": "UNKNOWN"}
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "error", "error": failure}}]
    assert [plain(e.error) for e in rec.of("agent/error")] == [failure]
    assert isinstance(rec.of("agent/error")[0].exception, ModelError)
    assert len(model.requests) == 1
    assert types_of(loop.log, "assistant/message") == []


@asynctest
async def test_request_header_logged_first_and_when_options_change():
    store = kerman.MemoryStore()
    log = store.create()
    model = ScriptedModel([f"reply {i}" for i in range(6)])
    loop = AgentLoop(model, log=log)
    plan = [None, None, {"x": 1}, {"x": 1}, None, None]
    n = 0

    @loop.before_request
    async def options(request, next):
        nonlocal n
        change = plan[n]
        n += 1
        if change:
            request.options.update(change)
        return await next()

    for i in range(6):
        loop.followup(f"p{i}")
        await loop.when_idle()
    # which request each header precedes (by the turn of the next assistant/message)
    headers = []
    pending = None
    for e in events(log, "request/header", "assistant/message"):
        if e.type == "request/header":
            pending = e.data
        elif pending is not None:
            headers.append((e.data["turn"], pending))
            pending = None
    assert headers == [(1, {"options": {}}), (3, {"options": {"x": 1}}), (5, {"options": {}})]
    assert [r.options for r in model.requests] == [{}, {}, {"x": 1}, {"x": 1}, {}, {}]

    # a new loop instance logs again on its first request, even with unchanged options
    await loop.aclose()  # a log has at most one inbox
    model2 = ScriptedModel(["again"])
    loop2 = AgentLoop(model2, log=log)
    loop2.followup("p6")
    await loop2.when_idle()
    assert [e.data for e in events(log, "request/header")][-1] == {"options": {}}
    assert len(events(log, "request/header")) == 4


@asynctest
async def test_request_header_compares_options_as_canonical_json():
    model = ScriptedModel(["one", "two", "three"])
    loop = AgentLoop(model)
    orders = [[("a", 1), ("b", {"y": 2, "z": 3})], [("b", {"z": 3, "y": 2}), ("a", 1)], [("a", 1), ("b", {"y": 2, "z": 4})]]
    n = 0

    @loop.before_request
    async def options(request, next):
        nonlocal n
        request.options.clear()
        for key, value in orders[n]:
            request.options[key] = value
        n += 1
        return await next()

    for i in range(3):
        loop.followup(f"p{i}")
        await loop.when_idle()
    assert [e.data for e in events(loop.log, "request/header")] == [
        {"options": {"a": 1, "b": {"y": 2, "z": 3}}},
        {"options": {"a": 1, "b": {"y": 2, "z": 4}}},
    ]


def test_options_keyword_sets_the_first_request_options() -> None:
    """Addition to SPEC 2.5: ``AgentLoop(..., options=...)`` gives ``request.options`` its
    initial value, logged in the first ``request/header``."""
    seen: List[Any] = []

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        seen.append(dict(request.options))
        return kerman.ModelReply("ok")

    async def main() -> None:
        loop = kerman.AgentLoop(model, options={"model": "m", "temperature": 0})
        loop.followup("hi")
        await loop.when_idle()
        headers = [e.data for e in loop.log.events(types="request/header")]
        assert headers == [{"options": {"model": "m", "temperature": 0}}]

    asyncio.run(main())
    assert seen == [{"model": "m", "temperature": 0}]


# --------------------------------------------------------------------------------------------
# Tools (SPEC 2.5, 4.4, 4.6; reference 5.8)
# --------------------------------------------------------------------------------------------


class Gates:
    """Per-key started/release events and a record of which tools ran at each start."""

    def __init__(self, keys: str) -> None:
        self.started = {k: asyncio.Event() for k in keys}
        self.release = {k: asyncio.Event() for k in keys}
        self.running: set = set()
        self.at_start: Dict[str, List[str]] = {}
        self.finished: List[str] = []

    async def body(self, key: str) -> str:
        self.at_start[key] = sorted(self.running)
        self.running.add(key)
        self.started[key].set()
        try:
            await self.release[key].wait()
        finally:
            self.running.discard(key)
        self.finished.append(key)
        return f"done {key}"


@asynctest
async def test_tools_parallel_pool_is_bounded_and_results_are_logged_in_model_order():
    gates = Gates("abcd")
    model = ScriptedModel([calls_reply(*[call(f"c{k}", "work", {"k": k}) for k in "abcd"]), "final"])

    async def work(args, ctx):
        return await gates.body(args["k"])

    loop = AgentLoop(model, tools=[Tool("work", work)], max_parallel_tool_calls=2)
    loop.followup("go")
    await gates.started["a"].wait()
    await gates.started["b"].wait()
    gates.release["b"].set()  # b finishes first: c may start, b's result must wait for a
    await gates.started["c"].wait()
    gates.release["c"].set()
    await gates.started["d"].wait()
    gates.release["d"].set()
    gates.release["a"].set()  # a finishes last
    await loop.when_idle()
    assert gates.finished == ["b", "c", "d", "a"]
    # with the bound of 2, c and d only started once a slot freed up
    assert gates.at_start == {"a": [], "b": ["a"], "c": ["a"], "d": ["a"]}
    calls_ = events(loop.log, "tool/call")
    results = events(loop.log, "tool/result")
    assert [e.data["callId"] for e in calls_] == ["ca", "cb", "cc", "cd"]
    assert [e.data["message"]["content"][0]["toolCallId"] for e in results] == ["ca", "cb", "cc", "cd"]
    assert [e.source_event_seqs for e in results] == [[e.seq] for e in calls_]
    assert min(e.seq for e in results) > max(e.seq for e in calls_)  # nothing committed before a
    assert [b["toolCallId"] for b in tool_result_blocks(model.requests[1])] == ["ca", "cb", "cc", "cd"]


@asynctest
async def test_tools_non_parallel_tool_runs_alone():
    gates = Gates("pxq")
    model = ScriptedModel(
        [calls_reply(call("c1", "par", {"k": "p"}), call("c2", "excl", {"k": "x"}), call("c3", "par", {"k": "q"})), "final"]
    )
    loop = AgentLoop(model)

    @loop.tool
    async def par(args, ctx):
        return await gates.body(args["k"])

    @loop.tool(parallel=False)
    async def excl(args, ctx):
        return await gates.body(args["k"])

    loop.followup("go")
    await gates.started["p"].wait()
    gates.release["p"].set()
    await gates.started["x"].wait()
    gates.release["x"].set()
    await gates.started["q"].wait()
    gates.release["q"].set()
    await loop.when_idle()
    assert gates.at_start == {"p": [], "x": [], "q": []}
    assert gates.finished == ["p", "x", "q"]
    assert [e.data["message"]["content"][0]["toolCallId"] for e in events(loop.log, "tool/result")] == ["c1", "c2", "c3"]


@asynctest
async def test_tools_serial_when_max_parallel_is_one():
    gates = Gates("ab")
    model = ScriptedModel([calls_reply(call("c1", "work", {"k": "a"}), call("c2", "work", {"k": "b"})), "final"])

    async def work(args, ctx):
        return await gates.body(args["k"])

    loop = AgentLoop(model, tools=[Tool("work", work)], max_parallel_tool_calls=1)
    loop.followup("go")
    await gates.started["a"].wait()
    gates.release["a"].set()
    await gates.started["b"].wait()
    gates.release["b"].set()
    await loop.when_idle()
    assert gates.at_start == {"a": [], "b": []}


@asynctest
async def test_tools_unknown_tool_gives_an_error_result_and_the_turn_continues():
    model = ScriptedModel([calls_reply(call("c1", "nope", {"x": 1})), "carried on"])
    loop = AgentLoop(model)
    loop.followup("go")
    await loop.when_idle()
    (tc,) = events(loop.log, "tool/call")
    assert tc.data == {"turn": 1, "step": 1, "callId": "c1", "name": "nope", "arguments": '{"x": 1}'}
    (tr,) = events(loop.log, "tool/result")
    assert tr.data["error"]["code"] == "UNKNOWN_TOOL"
    assert tr.source_event_seqs == [tc.seq]
    block = tr.data["message"]["content"][0]
    assert block["toolCallId"] == "c1" and block["isError"] is True
    assert len(model.requests) == 2
    assert tool_result_blocks(model.requests[1])[0]["isError"] is True
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]


@asynctest
async def test_tools_raising_tool_gives_a_TOOL_ERROR_result_with_the_exception_text():
    model = ScriptedModel([calls_reply(call("c1", "fragile")), "carried on"])
    loop = AgentLoop(model)

    class ToolBroke(Exception):
        pass

    @loop.tool
    async def fragile(args, ctx):
        raise ToolBroke("bad input: 42")

    loop.followup("go")
    await loop.when_idle()
    (tr,) = events(loop.log, "tool/result")
    assert plain(tr.data["error"]) == {"name": "ToolBroke", "code": "TOOL_ERROR"}
    assert tr.data["message"]["content"] == [
        {"type": "tool-result", "toolCallId": "c1", "content": [{"type": "text", "text": "bad input: 42"}], "isError": True}
    ]
    assert len(model.requests) == 2
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "completed"}}]


@asynctest
async def test_tools_context_and_tool_result_fields():
    model = ScriptedModel([calls_reply(call("c7", "inspect", {"a": [1, 2]})), "done"])
    loop = AgentLoop(model)
    seen: List[Any] = []

    @loop.tool(name="inspect", description="looks")
    async def inspect_tool(args, ctx):
        seen.append((args, ctx.call_id, ctx.turn, ctx.step, ctx.loop is loop, isinstance(ctx, ToolContext)))
        return ToolResult("flagged", is_error=True, meta={"k": "v"})

    loop.followup("go")
    await loop.when_idle()
    assert seen == [({"a": [1, 2]}, "c7", 1, 1, True, True)]
    (tr,) = events(loop.log, "tool/result")
    assert tr.data["meta"] == {"k": "v"}
    assert tr.data["message"]["content"][0]["isError"] is True
    assert [(t["name"], t["description"]) for t in model.requests[0].tools] == [("inspect", "looks")]


def test_str_tool_contexts_get_a_plugin_source_naming_the_tool() -> None:
    """SPEC 2.5 leaves the source of a ``str`` in ``additional_contexts`` open: it becomes
    ``{"kind": "plugin", "plugin": "tool:<name>"}`` (``tool`` is reserved for tool results)."""
    call = {"type": "tool-call", "id": "c1", "name": "look", "arguments": "{}"}

    async def main() -> None:
        loop = kerman.AgentLoop(ScriptedModel([kerman.ModelReply([call]), "done"]))

        @loop.tool
        async def look(args: Any, ctx: kerman.ToolContext) -> kerman.ToolResult:
            return kerman.ToolResult("found", additional_contexts=["note"])

        loop.followup("go")
        await loop.when_idle()
        entered = [e.data for e in loop.log.events(types="user/message")]
        assert entered[-1]["source"] == {"kind": "plugin", "plugin": "tool:look"}
        assert entered[-1]["content"] == [{"type": "text", "text": "note"}]

    asyncio.run(main())


# --------------------------------------------------------------------------------------------
# More turn-algorithm consequences (reference 5.5, 6.2; SPEC 4.7, 4.9)
# --------------------------------------------------------------------------------------------


@asynctest
async def test_empty_first_batch_stops_the_driver_even_with_pending_work():
    """SPEC 4.9 / reference 10.7: a no-step turn stops the driver; ``wake()`` restarts it."""
    model = ScriptedModel(["ran B"])
    loop = AgentLoop(model)
    rec = Recorder(loop)

    @loop.pre_step
    async def drop_a(step, next):
        if [m.text for m in step.messages] == ["A"]:
            return Enter([])
        return await next()

    loop.followup("A")
    b = loop.followup("B")
    await loop.when_idle()
    assert boundaries(loop.log) == [("turn/start", 1), ("turn/end", 1)]
    assert loop.inbox.next_turn == (b,)
    assert rec.statuses() == ["running", "idle"]
    assert model.requests == []
    assert loop.wake() is True
    await loop.when_idle()
    assert user_texts(loop.log) == ["B"]
    assert turn_ends(loop.log)[1] == {"turn": 2, "reason": {"kind": "completed"}}
    assert loop.wake() is False  # nothing pending


@asynctest
async def test_turn_stopping_listener_that_raises_fails_the_turn_after_its_step():
    model = ScriptedModel(["ok"])
    loop = AgentLoop(model)
    rec = Recorder(loop)

    @loop.turn_stopping
    async def broken(stop):
        raise RuntimeError("stopping hook broke")

    loop.followup("go")
    await loop.when_idle()
    failure = {"message": "stopping hook broke", "code": "UNKNOWN"}
    assert boundaries(loop.log) == [("turn/start", 1), ("step/start", 1, 1), ("step/end", 1, 1), ("turn/end", 1)]
    assert turn_ends(loop.log) == [{"turn": 1, "reason": {"kind": "error", "error": failure}}]
    assert [(e.turn, e.step, plain(e.error)) for e in rec.of("agent/error")] == [(1, 1, failure)]


@asynctest
async def test_turn_stopping_is_serial_and_a_truthy_result_bails():
    """Reference 6.2 serial mode: listeners run one by one; a non-null/false result stops
    the rest."""
    loop = AgentLoop(ScriptedModel(["one", "two"]))
    calls: List[str] = []
    started = asyncio.Event()
    release = asyncio.Event()

    @loop.turn_stopping
    async def first(stop):
        calls.append("first start")
        started.set()
        await release.wait()
        calls.append("first end")
        return stop.turn == 2  # bails in turn 2 only

    @loop.turn_stopping
    async def second(stop):
        calls.append(f"second {stop.turn}")

    loop.followup("one")
    loop.followup("two")
    await started.wait()
    await spin()
    assert calls == ["first start"]  # the second listener waits for the first
    release.set()
    await loop.when_idle()
    assert calls == ["first start", "first end", "second 1", "first start", "first end"]


@asynctest
async def test_before_request_may_replace_the_messages_without_touching_the_log():
    model = ScriptedModel(["one", "two"])
    loop = AgentLoop(model)

    async def only_last(request, next):
        request.messages = request.messages[-1:]
        return await next()

    loop.before_request(only_last)
    loop.followup("first")
    await loop.when_idle()
    loop.followup("second")
    await loop.when_idle()
    assert [texts(r) for r in model.requests] == [["first"], ["second"]]
    loop.remove_listener(only_last)
    model.add("three")
    loop.followup("third")
    await loop.when_idle()
    assert texts(model.requests[2]) == ["first", "one", "second", "two", "third"]


@asynctest
async def test_normal_end_with_pending_next_step_input_starts_the_next_turn_without_idling():
    """Reference 5.5 step 7: after a normal ending any pending item (either list) starts the
    next turn in the same running interval. Here a step-2 pre-step listener stages context
    after its claim and enters nothing (5.5 e), so turn 1 ends with next-step input pending."""
    loop = AgentLoop(EchoModel())
    rec = Recorder(loop)

    @loop.pre_step
    async def stage_late(step, next):
        if step.turn == 1 and step.step == 2:
            step.loop.inject("late context")
            return Enter([])
        return await next()

    @loop.turn_stopping
    async def one_more(stop):
        if stop.turn == 1:
            stop.loop.inject("more")

    loop.followup("A")
    await loop.when_idle()
    assert boundaries(loop.log) == [
        ("turn/start", 1),
        ("step/start", 1, 1),
        ("step/end", 1, 1),
        ("turn/end", 1),
        ("turn/start", 2),
        ("step/start", 2, 1),
        ("step/end", 2, 1),
        ("turn/end", 2),
    ]
    assert user_texts(loop.log) == ["A", "late context"]
    assert rec.statuses() == ["running", "idle"]
    assert [t["reason"] for t in turn_ends(loop.log)] == [{"kind": "completed"}, {"kind": "completed"}]
