"""AgentLoop persistence, resume and crash recovery.

Reference cases (``reference-behavior.md`` 7.9): RS-*, CR-*, each test named after its case id.
SPEC.md wins where they disagree; where a decision (SPEC 3, D1-D11) or a clarification (SPEC 4)
changes a reference case, the test checks the decided behaviour and says so. Then ``aclose``
(D7), resume (D11, reference 2.11), crash closers on reopen (2.10), ``requeue_claimed`` (D9)
and checkpoint durability.

Every test drives its own event loop with ``asyncio.run`` and synchronises through
``asyncio.Event``/futures or ``threading.Event`` handshakes, never through sleeps.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Optional

import pytest

import kerman
from conftest import event_record, header_record, read_raw_session, session_path, write_raw_session
from kerman import (
    NEXT_STEP,
    NEXT_TURN,
    AgentLoop,
    FileStore,
    LoopError,
    MemoryStore,
    ModelReply,
    ToolResultMessage,
)
from kerman.models import ScriptedModel
from loop.loop_helpers import (
    COMPLETED,
    DISPOSED,
    HangModel,
    Live,
    aborted,
    canceled_splices,
    count,
    drain,
    forever,
    of_type,
    result_of,
    result_text,
    texts,
    tool_calls,
    turn_ends,
    types_of,
)

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# 7.9 Persistence, resume, crash (RS-*, CR-*)
# --------------------------------------------------------------------------------------------


def test_RS_01_resume_of_a_persisted_session(tmp_path):
    """D12: no ``session/end-seed`` marker and no ``firstLiveSeq``: resuming appends nothing."""
    store = FileStore(tmp_path / "s", durability="none")
    log = store.create()
    sid = log.id

    async def first():
        loop = AgentLoop(ScriptedModel(["first reply"]), log=log)
        loop.followup("first prompt")
        await loop.when_idle()
        await loop.aclose()

    asyncio.run(first())
    stored = [e.to_dict() for e in log.events()]
    log.close()

    async def second():
        log2 = store.open(sid)
        try:
            assert [e.to_dict() for e in log2.events()] == stored
            model = ScriptedModel(["second reply"])
            loop = AgentLoop(model, log=log2)
            assert loop.turn == 1 and loop.status == "idle"
            assert len(log2) == len(stored)
            loop.followup("second prompt")
            await loop.when_idle()
            [request] = model.requests
            assert request.turn == 2
            assert [(type(m).__name__, m.text) for m in request.messages] == [
                ("UserMessage", "first prompt"),
                ("AssistantMessage", "first reply"),
                ("UserMessage", "second prompt"),
            ]
            assert [e.data["turn"] for e in log2.events() if e.type == "turn/start"] == [1, 2]
            assert [e.seq for e in log2.events()] == list(range(len(log2)))
            await loop.aclose()
        finally:
            log2.close()

    asyncio.run(second())


def test_RS_04_opening_a_session_whose_turn_is_open_elsewhere_is_refused(tmp_path):
    """Adapted: the reference refuses to resume a live session with an open turn; here the
    running loop's handle owns the session file, so another open gets ``SessionLockedError``."""

    async def main():
        store = FileStore(tmp_path / "s", durability="none")
        log = store.create()
        model = HangModel()
        loop = AgentLoop(model, log=log)
        loop.followup("go")
        await model.entered.wait()
        with pytest.raises(kerman.SessionLockedError):
            FileStore(tmp_path / "s", durability="none").open(log.id)
        await loop.aclose()
        log.close()

    asyncio.run(main())


async def _copy_while_open(log, src_root: Path, dst_root: Path) -> None:
    await log.flush()
    dst = session_path(dst_root, log.id)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(session_path(src_root, log.id), dst)


def test_CR_01_crash_after_the_request_was_checkpointed(tmp_path):
    """There is no ``request/context`` in Kerman (SPEC 4.7), so it is absent from the sequence."""
    src, dst = tmp_path / "live", tmp_path / "crashed"

    async def main():
        log = FileStore(src, durability="strict").create()
        model = HangModel()
        loop = AgentLoop(model, log=log)
        loop.followup("go")
        await model.entered.wait()
        await _copy_while_open(log, src, dst)
        await loop.aclose()
        log.close()
        return log.id

    sid = asyncio.run(main())
    copy = FileStore(dst, durability="none").open(sid)
    try:
        assert types_of(copy) == [
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "request/header",
            "step/end",
            "turn/end",
        ]
        assert turn_ends(copy) == [{"kind": "interrupted"}]
    finally:
        copy.close()


def test_a_resumed_loop_reports_the_turn_and_step_it_left_off_at(tmp_path):
    """``loop.step`` is "the last step entered in the running (or last) turn": after a resume,
    that of the last recorded turn, as ``loop.turn`` is its number (a two-step turn here)."""
    store = FileStore(tmp_path / "s", durability="none")
    log = store.create()

    async def first():
        loop = AgentLoop(ScriptedModel([tool_calls(("c1", "t")), "done"]), log=log)
        loop.tool(lambda: "ok", name="t")
        loop.followup("go")
        await loop.when_idle()
        seen = (loop.turn, loop.step)
        await loop.aclose()
        return seen

    seen = asyncio.run(first())
    assert seen == (1, 2)
    log.close()
    with store.open(log.id) as log2:
        loop = AgentLoop(ScriptedModel([]), log=log2)
        assert (loop.turn, loop.step) == seen


def test_CR_02_crash_during_a_tool_side_effect_then_resume(tmp_path):
    src, dst = tmp_path / "live", tmp_path / "crashed"

    async def crash():
        log = FileStore(src, durability="strict").create()
        loop = AgentLoop(ScriptedModel([tool_calls(("c1", "side_effect"))]), log=log)
        entered = asyncio.Event()

        @loop.tool
        async def side_effect(args, ctx):
            entered.set()
            await forever()

        loop.followup("go")
        await entered.wait()
        await _copy_while_open(log, src, dst)
        await loop.aclose()
        log.close()
        return log.id

    sid = asyncio.run(crash())

    async def resume():
        copy = FileStore(dst, durability="none").open(sid)
        try:
            [call] = of_type(copy, "tool/call")
            closer = result_of(copy, "c1")
            assert closer.data["error"] == {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}
            assert "Do not retry blindly." in result_text(closer)
            assert closer.source_event_seqs == [call.seq]
            assert types_of(copy)[-3:] == ["tool/result", "step/end", "turn/end"]
            assert turn_ends(copy) == [{"kind": "interrupted"}]

            model = ScriptedModel(["recovered"])
            loop = AgentLoop(model, log=copy)
            assert loop.turn == 1 and loop.status == "idle"
            assert loop.wake() is False
            loop.followup("what happened?")
            await loop.when_idle()
            [request] = model.requests
            assert request.turn == 2
            results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
            assert [(m.call_id, m.is_error) for m in results] == [("c1", True)]
            await loop.aclose()
        finally:
            copy.close()

    asyncio.run(resume())


def test_crash_closers_of_a_hand_written_session_then_resume(tmp_path):
    """Reference 2.10 on a session written by hand: an open turn whose assistant asked for two
    tools, one with a logged ``tool/call``. Opening closes it; the loop resumes at turn 2 and its
    first request sees both synthetic results."""
    root = tmp_path / "s"
    am = {
        "id": "a-1",
        "role": "assistant",
        "source": {"kind": "model"},
        "content": [
            {"type": "text", "text": "working"},
            {"type": "tool-call", "id": "c1", "name": "write", "arguments": "{}"},
            {"type": "tool-call", "id": "c2", "name": "read", "arguments": "{}"},
        ],
    }
    user = {"id": "u-1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
    write_raw_session(
        session_path(root, "crash"),
        header_record("crash"),
        [
            event_record(0, "turn/start", {"turn": 1}),
            event_record(1, "step/start", {"turn": 1, "step": 1}),
            event_record(2, "user/message", user, surface_op="append"),
            event_record(3, "assistant/message", {"turn": 1, "step": 1, "message": am}, surface_op="append", source_event_seqs=[]),
            event_record(4, "tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "write", "arguments": "{}"}),
        ],
    )

    async def main():
        log = FileStore(root, durability="none").open("crash")
        try:
            assert types_of(log, 5) == ["tool/result", "tool/result", "step/end", "turn/end"]
            assert result_of(log, "c1").data["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
            assert result_of(log, "c2").data["error"]["code"] == "TOOL_NOT_STARTED"
            model = ScriptedModel(["ok"])
            loop = AgentLoop(model, log=log)
            assert loop.turn == 1
            loop.followup("again")
            await loop.when_idle()
            [request] = model.requests
            assert request.turn == 2
            assert [m.call_id for m in request.messages if isinstance(m, ToolResultMessage)] == ["c1", "c2"]
            assert turn_ends(log) == [{"kind": "interrupted"}, COMPLETED]
        finally:
            log.close()

    asyncio.run(main())


# --------------------------------------------------------------------------------------------
# aclose (D7, SPEC 4.8) and resume (D11, reference 2.11)
# --------------------------------------------------------------------------------------------


def test_aclose_keeps_pending_input_durable_for_the_next_resume(tmp_path):
    store = FileStore(tmp_path / "s", durability="none")
    log = store.create()
    sid = log.id

    async def first():
        model = HangModel()
        loop = AgentLoop(model, log=log)
        loop.followup("go")
        loop.followup("tail")
        loop.inject("context")
        await model.entered.wait()
        await loop.aclose()
        assert turn_ends(log) == [aborted(DISPOSED)]
        assert canceled_splices(log) == []
        assert not log.closed  # aclose() closes only a log the loop created (SPEC 4.8)

    asyncio.run(first())
    log.close()

    async def second():
        log2 = store.open(sid)
        try:
            model = ScriptedModel(["resumed"])
            loop = AgentLoop(model, log=log2)
            assert texts(loop.inbox.next_turn) == ["tail"]
            assert texts(loop.inbox.next_step) == ["context"]
            assert loop.turn == 1
            size = len(log2)
            await drain()
            await loop.when_idle()
            assert loop.status == "idle" and len(log2) == size and model.requests == []
            assert loop.wake() is True
            await loop.when_idle()
            [request] = model.requests
            assert request.turn == 2 and texts(request.entered) == ["context", "tail"]
            assert loop.wake() is False  # nothing pending any more
            await loop.aclose()
        finally:
            log2.close()

    asyncio.run(second())


def test_aclose_discard_pending_discards_durably(tmp_path):
    store = FileStore(tmp_path / "s", durability="none")
    log = store.create()
    sid = log.id

    async def first():
        model = HangModel()
        loop = AgentLoop(model, log=log)
        live = Live(loop)
        loop.followup("go")
        tail = loop.followup("tail")
        ctx = loop.inject("context")
        await model.entered.wait()
        await loop.aclose(discard_pending=True)
        assert turn_ends(log) == [aborted(DISPOSED)]
        assert live.discarded == [ctx, tail]
        assert [d["target"] for d in canceled_splices(log)] == [NEXT_STEP, NEXT_TURN]

    asyncio.run(first())
    log.close()
    log2 = store.open(sid)
    try:
        assert kerman.Inbox(log2).has_pending is False
    finally:
        log2.close()


def test_aclose_on_an_idle_loop_keeps_pending_input_and_closes_only_its_own_log():
    async def main():
        own = AgentLoop(ScriptedModel([]))
        own.inject("kept")
        before = len(own.log)
        await own.aclose()
        assert own.log.closed
        assert len(own.log) == before and texts(own.inbox.next_step) == ["kept"]

        given = MemoryStore().create()
        loop = AgentLoop(ScriptedModel([]), log=given)
        loop.send("parked", NEXT_TURN, False)
        await loop.aclose()
        assert not given.closed
        assert texts(loop.inbox.next_turn) == ["parked"]
        given.close()

    asyncio.run(main())


def test_input_arriving_while_aclose_runs_starts_no_turn_and_stays_pending():
    """A waking message that arrives once ``aclose()`` has begun (here: while it waits for the
    cancelled turn; in a worker, staged input the store delivers meanwhile) must not start a
    turn on a loop whose log is about to close: it stays pending, for the next owner. As in the
    reference's disposal (5.2, CAN-37: "no extra turn"; 5.3: a disposed cancel never latches),
    and also when aclose() finds the loop idle, where the reference says nothing."""

    async def main():
        log = MemoryStore().create()
        model = HangModel()
        loop = AgentLoop(model, log=log)
        loop.followup("go")
        await model.entered.wait()
        closing = asyncio.ensure_future(loop.aclose())
        await drain()  # aclose has cancelled the turn and waits for it to end
        late = loop.followup("late")
        await closing
        assert turn_ends(log) == [aborted(DISPOSED)]
        assert len(model.requests) == 1 and loop.status == "idle"
        assert [m.id for m in loop.inbox.next_turn] == [late.id]
        log.close()

    asyncio.run(main())


def test_resume_restores_inbox_and_turn_counter_and_runs_nothing_until_wake(tmp_path):
    store = FileStore(tmp_path / "s", durability="none")
    log = store.create()
    sid = log.id

    async def first():
        loop = AgentLoop(ScriptedModel(["one", "two"]), log=log)
        loop.followup("one")
        await loop.when_idle()
        loop.followup("two")
        await loop.when_idle()
        loop.send("pending prompt", NEXT_TURN, False)
        await loop.aclose()

    asyncio.run(first())
    log.close()

    async def second():
        log2 = store.open(sid)
        try:
            model = ScriptedModel(["three"])
            loop = AgentLoop(model, log=log2)
            live = Live(loop)
            size = len(log2)
            assert loop.turn == 2 and loop.status == "idle"
            assert texts(loop.inbox.next_turn) == ["pending prompt"]
            await drain()
            await loop.when_idle()
            assert len(log2) == size and model.requests == [] and live.statuses == []
            assert loop.wake() is True
            await loop.when_idle()
            assert [r.turn for r in model.requests] == [3]
            assert live.statuses == ["running", "idle"]
            await loop.aclose()
        finally:
            log2.close()

    asyncio.run(second())


def test_wake_with_nothing_pending_returns_false():
    async def main():
        loop = AgentLoop(ScriptedModel([]))
        assert loop.wake() is False
        assert len(loop.log) == 0 and loop.status == "idle"

    asyncio.run(main())
    unbound = AgentLoop(ScriptedModel([]))
    assert unbound.wake() is False  # nothing pending: no event loop needed


# --------------------------------------------------------------------------------------------
# requeue_claimed (D9)
# --------------------------------------------------------------------------------------------


def _crash_between_claim_and_user_message(tmp_path) -> str:
    """Runs turn 1 (claiming next-step X and next-turn P, with Q queued behind P) into a hanging
    pre-step, copies the session file while the turn is open, and returns the id. The copy (in
    ``tmp_path/crashed``) ends between the claim and any ``user/message``."""
    src, dst = tmp_path / "live", tmp_path / "crashed"

    async def main():
        log = FileStore(src, durability="strict").create()
        loop = AgentLoop(ScriptedModel([]), log=log)
        entered = asyncio.Event()

        @loop.pre_step
        async def pre(step, next):
            entered.set()
            await forever()

        loop.inject("X")
        loop.followup("P")
        loop.followup("Q")
        await entered.wait()
        await _copy_while_open(log, src, dst)
        await loop.aclose()
        log.close()
        return log.id

    return asyncio.run(main())


def test_requeue_claimed_after_a_crash_between_claim_and_user_message(tmp_path):
    sid = _crash_between_claim_and_user_message(tmp_path)

    async def main():
        log = FileStore(tmp_path / "crashed", durability="none").open(sid)
        try:
            assert turn_ends(log) == [{"kind": "interrupted"}]
            model = ScriptedModel(["ok"])
            loop = AgentLoop(model, log=log)
            live = Live(loop)
            assert texts(loop.inbox.next_turn) == ["Q"] and loop.inbox.next_step == ()
            before = len(log)
            requeued = loop.requeue_claimed(1)
            assert texts(requeued) == ["X", "P"]
            assert texts(loop.inbox.next_step) == ["X"]
            assert texts(loop.inbox.next_turn) == ["P", "Q"]
            new = [e.data for e in log.events(before)]
            assert [e.type for e in log.events(before)] == ["agent/inbox/spliced"] * 2
            assert [(d["target"], d["start"], d.get("removedCount", 0), [m["id"] for m in d["inserted"]]) for d in new] == [
                (NEXT_STEP, 0, 0, [requeued[0].id]),
                (NEXT_TURN, 0, 0, [requeued[1].id]),
            ]
            assert live.inserted == requeued
            # it does not wake
            assert loop.status == "idle" and live.statuses == []
            await drain()
            assert count(log, "turn/start") == 1 and model.requests == []
            # a second call has nothing left
            with pytest.raises(LoopError):
                loop.requeue_claimed(1)
            assert len(log) == before + 2
            assert loop.wake() is True
            await loop.when_idle()
            assert texts(model.requests[0].entered) == ["X", "P"]
        finally:
            log.close()

    asyncio.run(main())


def test_requeue_claimed_raises_for_unknown_open_or_fully_entered_turns():
    async def main():
        model = HangModel(hang={2})
        loop = AgentLoop(model)
        with pytest.raises(LoopError):
            loop.requeue_claimed(1)  # unknown
        loop.followup("one")
        await loop.when_idle()
        with pytest.raises(LoopError):
            loop.requeue_claimed(1)  # its message was entered: nothing to requeue
        loop.followup("two")
        await model.entered.wait()
        size = len(loop.log)
        with pytest.raises(LoopError):
            loop.requeue_claimed(2)  # still open
        with pytest.raises(LoopError):
            loop.requeue_claimed(7)  # unknown
        assert len(loop.log) == size and not loop.inbox.has_pending
        loop.cancel()
        await loop.when_idle()

    asyncio.run(main())


def test_requeue_claimed_after_a_blocked_turn_returns_the_rejected_batch():
    """D9 applies to any finished turn: a rejected batch never appeared in a ``user/message``."""

    async def main():
        model = ScriptedModel(["ok"])
        loop = AgentLoop(model)
        rejected: list = []

        @loop.pre_step
        async def guard(step, next):
            if not rejected:
                rejected.append(list(step.messages))
                return kerman.Reject("no")
            return await next()

        p = loop.followup("P")
        await loop.when_idle()
        assert turn_ends(loop.log) == [{"kind": "blocked", "reason": "no"}]
        assert loop.requeue_claimed(1) == [p]
        assert loop.inbox.next_turn == (p,)
        assert loop.status == "idle"
        with pytest.raises(LoopError):
            loop.requeue_claimed(1)

    asyncio.run(main())


# --------------------------------------------------------------------------------------------
# checkpoint durability
# --------------------------------------------------------------------------------------------


def test_checkpoint_mode_flushes_before_the_model_request_and_each_tool_body(tmp_path):
    root = tmp_path / "s"

    async def main():
        log = FileStore(root, durability="checkpoint").create()
        path = session_path(root, log.id)
        seen: list = []

        def on_disk(where: str, must_have: Optional[int] = None) -> None:
            records = read_raw_session(path)
            assert all(ok for ok, _, _ in records)
            seqs = [rec["seq"] for _, rec, _ in records[1:]]
            seen.append((where, seqs, len(log) if must_have is None else must_have + 1))

        async def model(request):
            on_disk(f"model {request.step}")
            if request.step == 1:
                return tool_calls(("c1", "t"), ("c2", "t"))
            return ModelReply("done")

        loop = AgentLoop(model, log=log)

        @loop.tool
        async def t(args, ctx):
            own = [e.seq for e in log.events() if e.type == "tool/call" and e.data["callId"] == ctx.call_id]
            on_disk(f"tool {ctx.call_id}", own[0])
            return "ok"

        loop.followup("go")
        await loop.when_idle()
        await loop.aclose()
        log.close()
        return seen

    seen = asyncio.run(main())
    where = [w for w, _, _ in seen]
    # The two calls start in model order, but each body waits for its own flush barrier, so
    # which body runs first depends on which barrier completes first.
    assert where[0] == "model 1" and where[-1] == "model 2"
    assert sorted(where[1:3]) == ["tool c1", "tool c2"]
    for where, seqs, length in seen:
        # model: every event appended before the request is on disk; tool: every event up to
        # and including the call's own tool/call
        assert seqs[:length] == list(range(length)), where
