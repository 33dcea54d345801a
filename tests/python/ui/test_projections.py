"""kerman.ui: the AG-UI and Vercel projections over recorded logs (tests/python/ui/logs/).

Goldens pin the exact output; the other tests check it the way a client would: every AG-UI
event against the ag-ui-protocol models, every Vercel part against the documented shapes, the
queue rebuilt from the state events equal to InboxProjection's fold, the transcript equal to the
log's messages, and resuming after any event id giving exactly the rest.
Regenerate the goldens after an intended change with KERMAN_UPDATE_GOLDEN=1 and read the diff.
"""

from __future__ import annotations

import asyncio
import copy
import os

import pytest
from ui_helpers import HERE, LOGS, check_agui_event, check_vercel_part, json_patch, lines, recorded

import kerman
from kerman.ui import ResumePoint, agui, parse_resume, vercel

PROTOCOLS = {"agui": lambda events, **kw: agui(events, thread_id="thread-1", **kw), "vercel": vercel}


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize("name", LOGS)
def test_golden(name, protocol, tmp_path):
    got = lines(list(PROTOCOLS[protocol](recorded(name, tmp_path))))
    path = HERE / "golden" / f"{name}.{protocol}.jsonl"
    if os.environ.get("KERMAN_UPDATE_GOLDEN"):
        path.write_text("".join(line + "\n" for line in got), encoding="utf-8")
    assert got == path.read_text(encoding="utf-8").splitlines()


def test_every_scenario_is_recorded():
    assert set(LOGS) == {
        "text",
        "tools",
        "steering",
        "queue_edits",
        "rejection",
        "cancellation",
        "errors",
        "closers",
        "decisions",
        "custom",
        "structured_output",
        "compaction",
        "double_texting",
        "tool_progress",
    }


@pytest.mark.parametrize("name", LOGS)
def test_agui_events_are_valid_ag_ui(name, tmp_path):
    outputs = list(agui(recorded(name, tmp_path), thread_id="thread-1"))
    assert outputs
    for u in outputs:
        check_agui_event(u.data)


@pytest.mark.parametrize("name", LOGS)
def test_vercel_parts_have_the_documented_shapes(name, tmp_path):
    outputs = list(vercel(recorded(name, tmp_path)))
    assert outputs
    for u in outputs:
        check_vercel_part(u.data)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize("name", LOGS)
def test_resuming_after_any_event_id_gives_exactly_the_rest(name, protocol, tmp_path):
    events = recorded(name, tmp_path)
    outputs = list(PROTOCOLS[protocol](events))
    assert len({u.id for u in outputs}) == len(outputs)  # ids are unique
    for i, u in enumerate(outputs):
        assert list(PROTOCOLS[protocol](events, after=u.id)) == outputs[i + 1 :], u.id
    for event in events:  # a plain seq (the kerman protocol's ids) resumes after all its outputs
        assert list(PROTOCOLS[protocol](events, after=event.seq)) == [u for u in outputs if u.seq > event.seq]


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize("name", LOGS)
def test_projection_is_deterministic_over_event_dicts(name, protocol, tmp_path):
    events = recorded(name, tmp_path)
    assert list(PROTOCOLS[protocol]([e.to_dict() for e in events])) == list(PROTOCOLS[protocol](events))


def _queue_ids(state):
    return [(row["placement"], row["id"]) for row in state["nextTurn"] + state["nextStep"]]


def _folded(events, upto):
    items = kerman.InboxProjection.fold(e for e in events if e.seq <= upto and e.type == kerman.SPLICED).items()
    return sorted((p, m.id) for p, m in items)


@pytest.mark.parametrize("name", LOGS)
def test_agui_state_rebuilds_the_queue(name, tmp_path):
    events = recorded(name, tmp_path)
    state = None
    checked = 0
    for u in agui(events):
        if u.data["type"] == "STATE_SNAPSHOT":
            assert state is None, "one snapshot, then deltas"
            state = copy.deepcopy(u.data["snapshot"])
        elif u.data["type"] == "STATE_DELTA":
            state = json_patch(state, u.data["delta"])
        else:
            continue
        assert sorted(_queue_ids(state["queue"])) == _folded(events, u.seq)
        checked += 1
    assert checked == sum(e.type == kerman.SPLICED for e in events)


@pytest.mark.parametrize("name", LOGS)
def test_vercel_queue_parts_match_the_fold(name, tmp_path):
    events = recorded(name, tmp_path)
    queue = [u for u in vercel(events) if u.data["type"] == "data-queue"]
    assert len(queue) == sum(e.type == kerman.SPLICED for e in events)
    for u in queue:
        assert u.data["transient"] is True and u.data["id"] == "queue"
        assert sorted(_queue_ids(u.data["data"])) == _folded(events, u.seq)


def _text_blocks(message):
    return [b["text"] for b in message["content"] if b["type"] == "text"]


@pytest.mark.parametrize("name", LOGS)
def test_agui_transcript_equals_the_log(name, tmp_path):
    """Text messages open and close in pairs inside runs, tool calls are started, ended and
    answered once, and the streamed text of each assistant message is its text blocks."""
    events = recorded(name, tmp_path)
    texts: dict[str, list] = {}  # id -> [role, text, opening seq]
    open_text = None
    run = None
    calls: dict[str, list[str]] = {}
    for u in agui(events):
        d = u.data
        t = d["type"]
        if t == "RUN_STARTED":
            assert run is None
            run = d["runId"]
        elif t in ("RUN_FINISHED", "RUN_ERROR"):
            assert run is not None and open_text is None
            run = None
        elif t == "TEXT_MESSAGE_START":
            assert run is not None and open_text is None and d["messageId"] not in texts
            open_text = d["messageId"]
            texts[open_text] = [d["role"], "", u.seq]
        elif t == "TEXT_MESSAGE_CONTENT":
            assert d["messageId"] == open_text
            texts[open_text][1] += d["delta"]
        elif t == "TEXT_MESSAGE_END":
            assert d["messageId"] == open_text
            open_text = None
        elif t.startswith("TOOL_CALL_"):
            assert run is not None and open_text is None
            calls.setdefault(d["toolCallId"], []).append(t)
    assert run is None and open_text is None
    assert all(
        seq == ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
        or seq == ["TOOL_CALL_START", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
        for seq in calls.values()
    ), calls
    assert set(calls) == {e.data["callId"] for e in events if e.type == "tool/call"}
    for e in events:
        if e.type == "user/message":
            assert texts[e.data["id"]][:2] == ["user", kerman.Message.from_dict(e.data).text]
        elif e.type == "assistant/message":
            message = e.data["message"]
            sources = set(e.source_event_seqs or ())
            streamed = [text for role, text, seq in texts.values() if role == "assistant" and seq in sources]
            if sources:
                assert streamed == _text_blocks(message), e.seq
            else:
                assert texts.get(message["id"], ["assistant", "\n".join(_text_blocks(message))])[1] == "\n".join(_text_blocks(message))


def test_steering_and_context_are_marked(tmp_path):
    outputs = [u.data for u in agui(recorded("steering", tmp_path))]
    custom = [(d["name"], d["value"]["message"]["content"][0]["text"]) for d in outputs if d["type"] == "CUSTOM"]
    assert custom == [("kerman.steering", "keep it short"), ("kerman.context", "today is Friday")]
    parts = [
        (u.data["type"], u.data["data"]["text"])
        for u in vercel(recorded("steering", tmp_path))
        if u.data["type"] in ("data-prompt", "data-steering", "data-context")
    ]
    assert parts == [("data-prompt", "plan the release"), ("data-steering", "keep it short"), ("data-context", "today is Friday")]


def test_run_endings(tmp_path):
    def ends(name):
        return [
            (d["type"], d.get("outcome", {}).get("type"), d.get("code"))
            for d in (u.data for u in agui(recorded(name, tmp_path)))
            if d["type"] in ("RUN_FINISHED", "RUN_ERROR")
        ]

    assert ends("rejection") == [("RUN_FINISHED", "success", None)] * 2
    assert ends("cancellation") == [
        ("RUN_FINISHED", "cancelled", None),
        ("RUN_FINISHED", "success", None),
        ("RUN_FINISHED", "cancelled", None),
    ]
    assert ends("errors") == [("RUN_FINISHED", "success", None), ("RUN_ERROR", None, "RATE_LIMITED")]
    assert ends("closers") == [("RUN_ERROR", None, "INTERRUPTED")]
    finishes = [u.data for u in vercel(recorded("errors", tmp_path)) if u.data["type"] in ("finish", "error", "abort")]
    assert [(d["type"], d.get("finishReason"), d.get("errorText")) for d in finishes] == [
        ("finish", "stop", None),
        ("error", None, "rate limited"),
        ("finish", "error", None),
    ]
    assert "traceback" not in str(finishes) and "traceback" not in str([u.data for u in agui(recorded("errors", tmp_path))])
    aborts = [u.data for u in vercel(recorded("cancellation", tmp_path)) if u.data["type"] == "abort"]
    assert aborts == [{"type": "abort", "reason": "user"}] * 2


def test_tool_errors_reach_both_protocols(tmp_path):
    results = {d["toolCallId"]: d for d in (u.data for u in agui(recorded("tools", tmp_path))) if d["type"] == "TOOL_CALL_RESULT"}
    assert "metadata" not in results["c1"] and results["c1"]["content"] == "kerman: a durable agent loop"
    assert results["c2"]["metadata"]["kerman"]["isError"] is True and "the disk is on fire" in results["c2"]["content"]
    assert results["c3"]["metadata"]["kerman"]["error"]["code"] == "UNKNOWN_TOOL"
    parts = {(d["type"], d["toolCallId"]) for d in (u.data for u in vercel(recorded("tools", tmp_path))) if "toolCallId" in d}
    assert parts == {
        ("tool-input-available", "c1"),
        ("tool-output-available", "c1"),
        ("tool-input-available", "c2"),
        ("tool-output-error", "c2"),
        ("tool-input-available", "c3"),
        ("tool-output-error", "c3"),
    }


def test_a_synthesised_result_is_announced_first(tmp_path):
    """The closers' result of a tool that was running when the process stopped."""
    data = [u.data for u in agui(recorded("closers", tmp_path))]
    kinds = [d["type"] for d in data if d.get("toolCallId") == "t1"]
    assert kinds == ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]


def test_live_tail_gives_what_a_replay_gives():
    """The async path over log.tail() while a loop runs equals the sync replay afterwards."""

    async def main():
        release = asyncio.Event()

        async def model(request):
            yield {"type": "text-delta", "text": "one "}
            await release.wait()
            yield {"type": "text-delta", "text": "two"}

        loop = kerman.AgentLoop(model)

        async def consume(project):
            return [u async for u in project(loop.log.tail())]

        tasks = [asyncio.create_task(consume(p)) for p in (lambda e: agui(e, thread_id="t"), vercel)]
        loop.followup("go")
        loop.followup("queued")
        await asyncio.sleep(0)
        release.set()
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        live = await asyncio.gather(*tasks)
        assert live[0] == list(agui(events, thread_id="t"))
        assert live[1] == list(vercel(events))
        resumed = [u async for u in agui(_aiter(events), thread_id="t", after=live[0][5].id)]
        assert resumed == live[0][6:]

    asyncio.run(main())


async def _aiter(items):
    for item in items:
        yield item


def test_resume_points():
    assert parse_resume("12") == ResumePoint(12) and parse_resume("12:3") == ResumePoint(12, 3)
    assert parse_resume(4) == ResumePoint(4) and parse_resume(None) is None
    for bad in ("", "x", "-1", "1:", "1:2:3", "01", -1, True, 1.5):
        with pytest.raises(ValueError, match="invalid resume point"):
            parse_resume(bad)


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(TypeError, match="iterable"):
        agui(42)
    with pytest.raises(TypeError, match="kerman.Event or an event dict"):
        list(vercel([{"no": "seq"}]))
    bad = {"seq": 0, "type": kerman.SPLICED, "time": 0, "data": {"target": "next-turn", "start": 1, "inserted": []}}
    with pytest.raises(kerman.ProjectionError) as caught:
        list(agui([bad]))
    assert caught.value.seq == 0


def test_injected_text_is_context_not_steering():
    """``loop.inject("text")`` is context and ``loop.steer("text")`` steering, in the queue and as
    the message enters, in both protocols.

    The reference places a ``next-step`` message as steering when its source kind is ``user`` and
    as context otherwise, and leaves the source of ``inject(text)`` unsaid; Kerman gives a text
    injected so the source ``{"kind": "context"}``, since with ``user`` steer and inject left
    identical records and no view could tell them apart."""

    async def main():
        entered = asyncio.Event()
        go = asyncio.Event()
        loop = kerman.AgentLoop(
            kerman.models.ScriptedModel(
                [
                    [{"type": "tool-call", "id": "w1", "name": "wait", "arguments": "{}"}, {"type": "finish", "reason": "stop"}],
                    "done",
                ]
            )
        )

        @loop.tool
        async def wait() -> str:
            """Waits for the go-ahead."""
            entered.set()
            await go.wait()
            return "waited"

        loop.followup("plan the release")
        await entered.wait()
        loop.steer("keep it short")
        loop.inject("the build is green")
        go.set()
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events

    events = asyncio.run(main())
    outputs = [u.data for u in agui(events, thread_id="t")]
    custom = [(d["name"], d["value"]["message"]["content"][0]["text"]) for d in outputs if d["type"] == "CUSTOM"]
    assert custom == [("kerman.steering", "keep it short"), ("kerman.context", "the build is green")]
    queued = [row for d in outputs if d["type"] == "STATE_SNAPSHOT" for row in d["snapshot"]["queue"]["nextStep"]]
    queued += [
        op["value"]
        for d in outputs
        if d["type"] == "STATE_DELTA"
        for op in d["delta"]
        if isinstance(op.get("value"), dict) and "placement" in op["value"]
    ]
    placements = {row["text"]: row["placement"] for row in queued}
    assert placements == {"keep it short": "steering", "the build is green": "context"}, placements
    parts = [
        (u.data["type"], u.data["data"]["text"])
        for u in vercel(events)
        if u.data["type"] in ("data-prompt", "data-steering", "data-context")
    ]
    assert parts == [("data-prompt", "plan the release"), ("data-steering", "keep it short"), ("data-context", "the build is green")]


def test_a_waiting_turn_ends_its_run_with_interrupts_and_resumes_with_the_decisions(tmp_path):
    """AG-UI 1.0: the run of a step that waits ends with the interrupt outcome (one interrupt per
    pending request, bound to its call); the run that goes on carries every answer in
    ``input.resume``. Step 1's last call needs no decision, so its run ends at the next event;
    step 2's only call asks, so its run ends at the request."""
    events = recorded("decisions", tmp_path)
    requested = [e for e in events if e.type == "decision/requested"]
    runs = []
    for u in agui(events, thread_id="thread-1"):
        d = u.data
        if d["type"] == "RUN_STARTED":
            runs.append([u.seq, d["runId"], d.get("input", {}).get("resume")])
        elif d["type"] == "RUN_FINISHED":
            runs[-1] += [u.seq, d["outcome"]]
    assert [(r[1], r[4]["type"]) for r in runs] == [("turn-1", "interrupt"), ("turn-1.1", "interrupt"), ("turn-1.2", "success")]
    first, second, third = requested
    # each run ends at the request marked last: the step's round of gating is over there
    assert second.seq == first.seq + 1 and second.data.get("last") is True and "last" not in first.data
    assert runs[0][3] == second.seq and runs[1][3] == third.seq
    interrupts = runs[0][4]["interrupts"]
    assert [(i["id"], i["toolCallId"], i["reason"]) for i in interrupts] == [
        (first.data["decisionId"], "d1", "tool_approval"),
        (second.data["decisionId"], "d2", "tool_approval"),
    ]
    assert interrupts[0]["message"] == "move 900?" and interrupts[0]["expiresAt"] == "2100-01-01T00:00:00.000Z"
    assert "message" not in interrupts[1] and "expiresAt" not in interrupts[1]
    assert interrupts[0]["metadata"]["kerman"]["arguments"] == '{"amount": 900}'
    assert interrupts[0]["metadata"]["kerman"]["digest"] == first.data["digest"]
    resume = runs[1][2]
    assert [(r["interruptId"], r["status"], r["payload"]["outcome"]) for r in resume] == [
        (first.data["decisionId"], "resolved", "approved"),
        (second.data["decisionId"], "resolved", "edited"),
    ]
    assert resume[1]["payload"]["arguments"] == '{"amount":40}' and resume[0]["metadata"]["kerman"]["by"] == "ann"
    assert runs[2][2] == [
        {
            "interruptId": third.data["decisionId"],
            "status": "resolved",
            "payload": {"outcome": "denied", "reason": "too much"},
            "metadata": {"kerman": {"outcome": "denied", "by": "bob"}},
        }
    ]
    assert runs[1][4]["interrupts"][0]["id"] == third.data["decisionId"]


def test_vercel_shows_approval_requests_and_denials(tmp_path):
    """AI SDK 6 parts: the call's input, ``tool-approval-request`` (approvalId = the decision id),
    a ``data-decision`` part the resolution replaces; a denial is ``tool-output-denied`` and no
    error output; an approved call's input is not sent twice, an edited one's is."""
    events = recorded("decisions", tmp_path)
    ids = {e.data["callId"]: e.data["decisionId"] for e in events if e.type == "decision/requested"}
    parts = [u.data for u in vercel(events)]
    approvals = [(d["toolCallId"], d["approvalId"]) for d in parts if d["type"] == "tool-approval-request"]
    assert approvals == [("d1", ids["d1"]), ("d2", ids["d2"]), ("d4", ids["d4"])]
    inputs = [(d["toolCallId"], d["input"]) for d in parts if d["type"] == "tool-input-available"]
    assert inputs == [
        ("d1", {"amount": 900}),
        ("d2", {"amount": 50}),
        ("d2", {"amount": 40}),
        ("d3", {"q": "rates"}),
        ("d4", {"amount": 7000}),
    ]
    outputs = [(d["type"], d["toolCallId"]) for d in parts if d["type"].startswith("tool-output")]
    assert outputs == [
        ("tool-output-available", "d1"),
        ("tool-output-available", "d2"),
        ("tool-output-available", "d3"),
        ("tool-output-denied", "d4"),
    ]
    decisions = [(d["id"], d["data"]["status"]) for d in parts if d["type"] == "data-decision"]
    assert decisions == [
        (ids["d1"], "pending"),
        (ids["d2"], "pending"),
        (ids["d1"], "approved"),
        (ids["d2"], "edited"),
        (ids["d4"], "pending"),
        (ids["d4"], "denied"),
    ]
    denied = [d for d in parts if d["type"] == "data-decision" and d["data"]["status"] == "denied"][0]
    assert denied["data"]["resolution"]["reason"] == "too much" and denied["data"]["note"] == "move 7000?"


def test_a_question_cancelled_while_waiting():
    """A request with a schema is a ``tool_answer`` interrupt with its ``responseSchema`` and no
    Vercel approval part; a cancel while waiting resumes with a ``cancelled`` entry, the run ends
    cancelled, and the Vercel stream shows the aborted result (not a denial)."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}

    async def main():
        loop = kerman.AgentLoop(
            kerman.models.ScriptedModel([kerman.ModelReply([{"type": "tool-call", "id": "q1", "name": "where", "arguments": "{}"}])])
        )

        @loop.tool
        async def where() -> str:
            """Asks where."""
            return "never"

        @loop.before_tool
        async def gate(call, next):
            return kerman.Ask(note="which city?", schema=schema)

        loop.followup("book a hotel")
        await loop.when_idle()
        assert loop.status == "waiting"
        loop.cancel()
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events

    events = asyncio.run(main())
    [request] = [e for e in events if e.type == "decision/requested"]
    data = [u.data for u in agui(events, thread_id="t")]
    for d in data:
        check_agui_event(d)
    ends = [d for d in data if d["type"] in ("RUN_STARTED", "RUN_FINISHED")]
    assert [(d["type"], d["runId"]) for d in ends] == [
        ("RUN_STARTED", "turn-1"),
        ("RUN_FINISHED", "turn-1"),
        ("RUN_STARTED", "turn-1.1"),
        ("RUN_FINISHED", "turn-1.1"),
    ]
    [interrupt] = ends[1]["outcome"]["interrupts"]
    assert interrupt["reason"] == "tool_answer" and interrupt["responseSchema"] == schema
    assert interrupt["message"] == "which city?" and interrupt["id"] == request.data["decisionId"]
    [entry] = ends[2]["input"]["resume"]
    assert entry["status"] == "cancelled" and "payload" not in entry and entry["metadata"]["kerman"]["outcome"] == "cancelled"
    assert ends[3]["outcome"] == {"type": "cancelled"}
    parts = [u.data for u in vercel(events)]
    for d in parts:
        check_vercel_part(d)
    kinds = [d["type"] for d in parts if d["type"].startswith("tool-")]
    assert kinds == ["tool-input-available", "tool-output-error"]
    assert [d["data"]["status"] for d in parts if d["type"] == "data-decision"] == ["pending", "cancelled"]
