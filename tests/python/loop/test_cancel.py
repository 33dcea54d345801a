"""AgentLoop cancellation: cancel(), disposal, the wake latch and Signal.

Reference cases (``reference-behavior.md`` 7.5): CAN-*, each test named after its case id.
SPEC.md wins where they disagree; where a decision (SPEC 3, D1-D11) or a clarification (SPEC 4)
changes a reference case, the test checks the decided behaviour and says so. Then SPEC-specific
behaviour: 4.4 (cancellation throws ``CancelledError`` into awaited user code), 4.5 (Signal),
keep_inbox and the wake latch (reference 5.9) and ``when_idle`` (5.10).

Errors and recovery (ERR-*) are in test_turn_errors.py, resume and crash recovery (RS-*, CR-*)
in test_resume.py, asyncio integration in runtime/test_asyncio.py.

Every test drives its own event loop with ``asyncio.run`` and synchronises through
``asyncio.Event``/futures or ``threading.Event`` handshakes, never through sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any, Dict

import pytest

import kerman
from conftest import plain
from kerman import (
    NEXT_STEP,
    NEXT_TURN,
    AgentLoop,
    Enter,
    KermanError,
    MemoryStore,
    ModelError,
    ModelReply,
    Retry,
    ToolResult,
    ToolResultMessage,
    TurnAborted,
)
from kerman.models import ScriptedModel
from loop.loop_helpers import (
    COMPLETED,
    DISPOSED,
    PARENT,
    USER,
    CancelledError,
    HangModel,
    Live,
    aborted,
    boundaries,
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
    user_texts,
)

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# 7.5 Cancellation and wake latch (CAN-*)
# --------------------------------------------------------------------------------------------


def test_CAN_01_idle_cancel_with_nothing_queued_is_a_noop():
    async def main():
        model = ScriptedModel(["answer"])
        loop = AgentLoop(model)
        live = Live(loop)
        loop.cancel()
        loop.cancel("parent", keep_inbox=True)
        assert len(loop.log) == 0
        assert loop.status == "idle" and live.statuses == [] and live.discarded == []
        loop.followup("prompt")
        await loop.when_idle()
        assert turn_ends(loop.log) == [COMPLETED]
        assert user_texts(loop.log) == ["prompt"]
        assert len(model.requests) == 1

    asyncio.run(main())


def test_CAN_02_keep_inbox_cancel_right_after_a_waking_followup():
    """The prompt was claimed synchronously by ``followup``; a keep_inbox cancel leaves no canceled
    splice and the turn ends aborted without a step or a request."""

    async def main():
        model = ScriptedModel(["later"])
        loop = AgentLoop(model)
        loop.followup("P")
        loop.cancel("user", keep_inbox=True)
        await loop.when_idle()
        assert canceled_splices(loop.log) == []
        assert user_texts(loop.log) == []
        assert model.requests == []
        assert boundaries(loop.log) == ["turn/start", "turn/end"]
        assert turn_ends(loop.log) == [aborted(USER)]
        assert loop.status == "idle"

        loop.followup("Q")
        await loop.when_idle()
        assert turn_ends(loop.log) == [aborted(USER), COMPLETED]
        assert user_texts(loop.log) == ["Q"]
        assert len(model.requests) == 1

    asyncio.run(main())


def test_CAN_03_keep_inbox_cancel_parks_work_queued_before_the_abort():
    async def main():
        model = HangModel(hang={1})
        loop = AgentLoop(model)
        loop.followup("active")
        await model.entered.wait()
        loop.followup("preserved")  # the live driver would claim it itself: not latched
        loop.cancel("user", keep_inbox=True)
        await loop.when_idle()
        assert user_texts(loop.log) == ["active"]
        assert texts(loop.inbox.next_turn) == ["preserved"]
        assert len(model.requests) == 1
        assert count(loop.log, "turn/start") == 1
        assert loop.status == "idle"

        loop.followup("wake")
        await loop.when_idle()
        assert user_texts(loop.log) == ["active", "preserved", "wake"]
        assert len(model.requests) == 3
        assert turn_ends(loop.log) == [aborted(USER), COMPLETED, COMPLETED]
        assert [r.turn for r in model.requests] == [1, 2, 3]

    asyncio.run(main())


def test_CAN_04_wake_sent_after_the_abort_is_latched_and_replayed_after_turn_end():
    """CAN-04 is referenced by CAN-05 but not spelled out; this is reference 5.9's wake latch: a
    waking send that lands while the running turn is already aborted goes to next-turn, is latched
    and replayed by the exiting driver after ``turn/end`` (``turn/end 1`` precedes
    ``turn/start 2``). Statuses follow reference 5.4 (idle is emitted, then the new driver)."""

    async def main():
        model = HangModel(hang={1})
        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("A")
        await model.entered.wait()
        loop.cancel()
        b = loop.followup("B")
        assert b.id in loop.inbox and texts(loop.inbox.next_turn) == ["B"]
        await loop.when_idle()
        assert turn_ends(loop.log) == [aborted(USER), COMPLETED]
        assert user_texts(loop.log) == ["A", "B"]
        assert len(model.requests) == 2
        end1 = [e.seq for e in loop.log.events() if e.type == "turn/end"][0]
        start2 = [e.seq for e in loop.log.events() if e.type == "turn/start"][1]
        assert end1 < start2
        assert live.statuses == ["running", "idle", "running", "idle"]
        assert loop.status == "idle" and not loop.inbox.has_pending

    asyncio.run(main())


def test_CAN_05_plain_cancel_discards_the_latched_wake():
    async def main():
        model = HangModel(hang={1})
        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("A")
        await model.entered.wait()
        loop.cancel()
        b = loop.followup("B")  # latched
        loop.cancel()  # clears B and the latch
        assert not loop.inbox.has_pending
        assert b in live.discarded
        await loop.when_idle()
        assert turn_ends(loop.log) == [aborted(USER)]
        assert count(loop.log, "turn/start") == 1
        assert len(model.requests) == 1

        loop.followup("C")
        await loop.when_idle()
        assert user_texts(loop.log) == ["A", "C"]
        assert turn_ends(loop.log) == [aborted(USER), COMPLETED]

    asyncio.run(main())


def _slow_cleanup_model():
    """A model whose first request hangs and, once cancelled, converges only when released."""
    state = {"requests": [], "entered": asyncio.Event(), "cleanup": asyncio.Event(), "release": asyncio.Event()}

    async def model(request):
        state["requests"].append(request)
        if len(state["requests"]) == 1:
            state["entered"].set()
            try:
                await forever()
            except CancelledError:
                state["cleanup"].set()
                await state["release"].wait()
                raise
        return ModelReply("ok")

    return model, state


def test_CAN_07_wake_during_a_slow_abort_convergence_is_latched():
    async def main():
        model, st = _slow_cleanup_model()
        loop = AgentLoop(model)
        loop.followup("A")
        await st["entered"].wait()
        loop.cancel()
        await st["cleanup"].wait()  # the model is converging slowly
        assert loop.status == "running"
        loop.followup("B")
        st["release"].set()
        await loop.when_idle()
        assert user_texts(loop.log) == ["A", "B"]
        assert turn_ends(loop.log) == [aborted(USER), COMPLETED]
        assert len(st["requests"]) == 2

    asyncio.run(main())


def test_CAN_08_wake_after_disposal_began_is_not_latched():
    """Disposal is ``aclose()``. Under D7 it keeps pending input, so the late message stays pending
    (durably) instead of being discarded — but it never runs."""

    async def main():
        model, st = _slow_cleanup_model()
        log = MemoryStore().create()
        loop = AgentLoop(model, log=log)
        loop.followup("A")
        await st["entered"].wait()
        closing = asyncio.create_task(loop.aclose())
        await st["cleanup"].wait()  # aclose() cancelled with "disposed"; the model converges
        late = loop.followup("late")
        st["release"].set()
        await closing
        await loop.when_idle()
        assert len(st["requests"]) == 1
        assert count(log, "turn/start") == 1
        assert turn_ends(log) == [aborted(DISPOSED)]
        assert user_texts(log) == ["A"]
        assert loop.inbox.next_turn == (late,)
        assert loop.status == "idle"

    asyncio.run(main())


def test_CAN_09_two_followups_then_cancel_in_one_tick():
    async def main():
        model = ScriptedModel(["x", "y"])
        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("a")
        b = loop.followup("b")
        loop.cancel("user")
        await loop.when_idle()
        assert count(loop.log, "turn/start") == 1
        assert count(loop.log, "step/start") == 0
        assert user_texts(loop.log) == []
        assert turn_ends(loop.log) == [aborted(USER)]
        assert model.requests == []
        assert live.discarded == [b]
        assert loop.status == "idle" and live.statuses == ["running", "idle"]

    asyncio.run(main())


def test_CAN_10_disposal_started_from_the_running_status_listener():
    """Disposal is ``aclose()``, which begins with ``cancel("disposed", keep_inbox=True)``; a sync
    status listener performs that step and schedules the rest. No ``turn/start`` is recorded.
    Under D7 the prompt stays pending instead of being discarded."""

    async def main():
        model = ScriptedModel(["never"])
        log = MemoryStore().create()
        loop = AgentLoop(model, log=log)
        live = Live(loop)
        closing: list = []

        @loop.on("agent/status")
        def dispose(event):
            if event.status == "running" and not closing:
                loop.cancel("disposed", keep_inbox=True)
                closing.append(asyncio.ensure_future(loop.aclose()))

        p = loop.followup("a")
        await closing[0]
        assert types_of(log) == ["agent/inbox/spliced"]
        assert model.requests == []
        assert live.statuses == ["running", "idle"]
        assert loop.status == "idle"
        assert loop.inbox.next_turn == (p,)

    asyncio.run(main())


def test_CAN_11_when_idle_waiter_resolves_after_cancel():
    async def main():
        model = HangModel()
        loop = AgentLoop(model)
        loop.followup("q")
        waiter = asyncio.create_task(loop.when_idle())
        await model.entered.wait()
        assert not waiter.done()
        loop.cancel()
        await waiter
        assert loop.status == "idle"
        assert turn_ends(loop.log) == [aborted(USER)]

    asyncio.run(main())


def test_cancelling_a_when_idle_waiter_leaves_the_turn_running():
    async def main():
        model = HangModel()
        loop = AgentLoop(model)
        loop.followup("q")
        waiter = asyncio.create_task(loop.when_idle())
        await model.entered.wait()
        task = loop._task
        waiter.cancel()
        # ... and says so, with how to stop it (issue 15: an interrupted notebook cell)
        with pytest.warns(kerman.TurnStillRunningWarning, match=r"turn 1 is still running in the background: loop.cancel\(\)"):
            with pytest.raises(asyncio.CancelledError):
                await waiter
        assert loop.status == "running" and not task.done()  # the turn goes on
        again = asyncio.create_task(loop.when_idle())
        await asyncio.sleep(0)
        assert not again.done()
        loop.cancel()
        await again
        assert loop.status == "idle" and turn_ends(loop.log) == [aborted(USER)]
        assert task.done() and not task.cancelled()

    asyncio.run(main())


def test_CAN_12_idle_listener_sends_a_replacement_waits_then_cancels():
    async def main():
        model = ScriptedModel(["one", "two"])
        loop = AgentLoop(model)
        state: Dict[str, Any] = {}

        @loop.on("agent/status")
        def on_status(event):
            if event.status == "idle" and "waiter" not in state:
                state["waiter"] = None
                loop.followup("replacement")
                state["waiter"] = asyncio.ensure_future(loop.when_idle())
                loop.cancel()

        loop.followup("first")
        await loop.when_idle()
        await state["waiter"]
        assert loop.status == "idle"
        assert len(model.requests) == 1
        assert count(loop.log, "turn/start") == 2
        assert turn_ends(loop.log) == [COMPLETED, aborted(USER)]

        loop.followup("later")
        await loop.when_idle()
        assert len(model.requests) == 2
        assert turn_ends(loop.log)[-1] == COMPLETED
        assert user_texts(loop.log) == ["first", "later"]

    asyncio.run(main())


def test_CAN_14_mid_stream_followup_then_cancel():
    async def main():
        streamed = asyncio.Event()
        requests: list = []

        async def model(request):
            requests.append(request)
            yield {"type": "text-delta", "text": "partial"}
            streamed.set()
            await forever()

        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("go")
        await streamed.wait()
        tail = loop.followup("queued tail")
        loop.cancel("user")
        await loop.when_idle()
        assert count(loop.log, "turn/start") == 1
        assert turn_ends(loop.log) == [aborted(USER)]
        assert user_texts(loop.log) == ["go"]
        assert len(requests) == 1
        assert tail in live.discarded and not loop.inbox.has_pending
        [msg] = of_type(loop.log, "assistant/message")
        assert msg.data["interrupted"] is True
        assert msg.data["message"]["content"] == [{"type": "text", "text": "partial"}]
        assert msg.source_event_seqs == [e.seq for e in of_type(loop.log, "assistant/chunk")]
        assert boundaries(loop.log) == ["turn/start", "step/start", "step/end", "turn/end"]

    asyncio.run(main())


@pytest.mark.parametrize("keep_inbox", [False, True])
def test_CAN_15_cancel_from_an_assistant_message_observer_before_tool_dispatch(keep_inbox):
    """A log observer may call ``cancel()``: with an empty inbox the clear is a no-op (reference
    3.2: no event), so nothing is appended from inside the observer."""

    async def main():
        model = ScriptedModel([tool_calls(("c1", "probe")), "after"])
        loop = AgentLoop(model)
        ran: list = []

        @loop.tool
        async def probe(args, ctx):
            ran.append(ctx.call_id)
            return "ran"

        fired: list = []

        def observer(event):
            if event.type == "assistant/message" and not fired:
                fired.append(event.seq)
                loop.cancel(keep_inbox=keep_inbox)

        loop.log.subscribe(observer)
        loop.followup("go")
        await loop.when_idle()
        assert ran == []
        [call] = of_type(loop.log, "tool/call")
        assert call.data["callId"] == "c1" and call.data["name"] == "probe"
        result = result_of(loop.log, "c1")
        assert result.data["error"] == {"name": "AbortError", "code": "ABORTED_BEFORE_DISPATCH"}
        assert result.source_event_seqs == [call.seq]
        assert result.data["message"]["content"][0]["isError"] is True
        assert turn_ends(loop.log) == [aborted(USER)]

        loop.followup("next")
        await loop.when_idle()
        assert turn_ends(loop.log)[-1] == COMPLETED
        replayed = [m for m in model.requests[1].messages if isinstance(m, ToolResultMessage)]
        assert [(m.call_id, m.is_error) for m in replayed] == [("c1", True)]

    asyncio.run(main())


def test_CAN_16_a_prompt_after_a_cancelled_turn_runs_normally():
    async def main():
        model = HangModel(hang={1})
        loop = AgentLoop(model)
        loop.followup("first")
        await model.entered.wait()
        loop.cancel()
        await loop.when_idle()
        loop.followup("second")
        await loop.when_idle()
        assert turn_ends(loop.log) == [aborted(USER), COMPLETED]
        assert texts(model.requests[1].entered) == ["second"]
        [reply] = of_type(loop.log, "assistant/message")
        assert reply.data["message"]["content"] == [{"type": "text", "text": "reply 2"}]

    asyncio.run(main())


def _streaming_hang(chunks, streamed: asyncio.Event, requests: list):
    async def model(request):
        requests.append(request)
        for chunk in chunks:
            yield chunk
        streamed.set()
        await forever()

    return model


def test_CAN_18_cancel_during_reasoning_only_stream_keeps_reasoning_and_usage():
    async def main():
        streamed, requests = asyncio.Event(), []
        usage = {"inputTokens": 3, "outputTokens": 2}
        model = _streaming_hang(
            [
                {"type": "reasoning-delta", "text": "thinking "},
                {"type": "reasoning-delta", "text": "hard"},
                {"type": "usage", **usage},
            ],
            streamed,
            requests,
        )
        loop = AgentLoop(model)
        loop.followup("go")
        await streamed.wait()
        loop.cancel()
        await loop.when_idle()
        [msg] = of_type(loop.log, "assistant/message")
        assert msg.data["interrupted"] is True
        assert msg.data["message"]["content"] == [{"type": "reasoning", "text": "thinking hard"}]
        assert msg.data["usage"] == usage
        assert msg.source_event_seqs == [e.seq for e in of_type(loop.log, "assistant/chunk")]
        assert len(msg.source_event_seqs) == 3
        assert turn_ends(loop.log) == [aborted(USER)]

    asyncio.run(main())


def test_CAN_19_cancel_after_a_tool_call_chunk_keeps_the_text_and_drops_the_call():
    """Kerman's stream has no partial tool-call deltas: a ``tool-call`` chunk is whole. The
    interrupted message keeps only visible text/reasoning, so the call is dropped and never
    dispatched, as the reference does for a half-streamed call."""

    async def main():
        streamed, requests = asyncio.Event(), []
        model = _streaming_hang(
            [
                {"type": "text-delta", "text": "keep "},
                {"type": "text-delta", "text": "this"},
                {"type": "tool-call", "id": "c1", "name": "probe", "arguments": "{}"},
            ],
            streamed,
            requests,
        )
        loop = AgentLoop(model)
        ran: list = []

        @loop.tool
        async def probe(args, ctx):
            ran.append(1)
            return "ran"

        loop.followup("go")
        await streamed.wait()
        loop.cancel()
        await loop.when_idle()
        [msg] = of_type(loop.log, "assistant/message")
        assert msg.data["interrupted"] is True
        assert msg.data["message"]["content"] == [{"type": "text", "text": "keep this"}]
        assert of_type(loop.log, "tool/call") == [] and ran == []
        assert turn_ends(loop.log) == [aborted(USER)]

    asyncio.run(main())


def test_CAN_20_cancel_inside_request_error():
    async def main():
        model = ScriptedModel([ModelError("flaky", code="OVERLOADED"), "never"])
        loop = AgentLoop(model)
        live = Live(loop)
        seen: list = []

        @loop.request_error
        async def recover(failure, next):
            seen.append(failure.failure)
            loop.cancel()
            try:
                await forever()
            except CancelledError:
                seen.append("cancelled")
                raise
            return Retry()

        loop.followup("go")
        await loop.when_idle()
        assert plain(seen) == [{"message": "flaky", "code": "OVERLOADED"}, "cancelled"]
        assert of_type(loop.log, "assistant/message") == []
        assert len(model.requests) == 1
        assert turn_ends(loop.log) == [aborted(USER)]
        assert live.errors == []

    asyncio.run(main())


def test_CAN_22_cancel_before_any_visible_content_logs_no_assistant_message():
    async def main():
        streamed, requests = asyncio.Event(), []
        model = _streaming_hang([{"type": "tool-call", "id": "c1", "name": "probe", "arguments": "{}"}], streamed, requests)
        loop = AgentLoop(model)
        loop.followup("go")
        await streamed.wait()
        loop.cancel()
        await loop.when_idle()
        # the partial tool call, then the loop's cancelled finish: the request is in the log
        # once (docs/usage.md), with no assistant/message
        assert [e.data["chunk"]["type"] for e in of_type(loop.log, "assistant/chunk")] == ["tool-call", "finish"]
        assert of_type(loop.log, "assistant/chunk")[-1].data["chunk"] == {"type": "finish", "reason": "cancelled"}
        assert of_type(loop.log, "assistant/message") == []
        assert of_type(loop.log, "tool/call") == []
        assert turn_ends(loop.log) == [aborted(USER)]
        assert boundaries(loop.log) == ["turn/start", "step/start", "step/end", "turn/end"]

    asyncio.run(main())


@pytest.mark.parametrize("keep_inbox", [False, True])
def test_CAN_23_cancel_from_a_step_start_observer(keep_inbox):
    async def main():
        model = ScriptedModel([[{"type": "text-delta", "text": "never"}, {"type": "finish", "reason": "stop"}]])
        loop = AgentLoop(model)

        def observer(event):
            if event.type == "step/start":
                loop.cancel(keep_inbox=keep_inbox)

        loop.log.subscribe(observer)
        loop.followup("go")
        await loop.when_idle()
        assert model.requests == []
        assert count(loop.log, "assistant/chunk") == 0
        assert of_type(loop.log, "assistant/message") == []
        assert count(loop.log, "step/start") == count(loop.log, "step/end") == 1
        assert turn_ends(loop.log) == [aborted(USER)]

    asyncio.run(main())


def test_CAN_24_cancel_inside_turn_stopping():
    async def main():
        model = ScriptedModel(["one", "two"])
        loop = AgentLoop(model)
        seen: list = []

        @loop.turn_stopping
        async def stopping(stop):
            loop.steer("would continue")
            loop.cancel()
            try:
                await forever()
            except CancelledError:
                seen.append("cancelled")
                raise

        loop.followup("go")
        await loop.when_idle()
        assert seen == ["cancelled"]
        assert count(loop.log, "step/start") == 1
        assert len(model.requests) == 1
        assert turn_ends(loop.log) == [aborted(USER)]
        assert boundaries(loop.log) == ["turn/start", "step/start", "step/end", "turn/end"]

    asyncio.run(main())


def test_CAN_25_cancel_from_the_running_status_listener():
    async def main():
        model = ScriptedModel(["never"])
        loop = AgentLoop(model)
        live = Live(loop)

        @loop.on("agent/status")
        def on_status(event):
            if event.status == "running":
                loop.cancel()

        p = loop.followup("a")
        await loop.when_idle()
        assert count(loop.log, "turn/start") == 0
        assert count(loop.log, "assistant/chunk") == 0
        assert model.requests == []
        assert live.statuses == ["running", "idle"]
        # the plain cancel cleared the prompt (reference 3.8)
        assert types_of(loop.log) == ["agent/inbox/spliced", "agent/inbox/spliced"]
        assert canceled_splices(loop.log)[0]["target"] == NEXT_TURN
        assert live.discarded == [p]

    asyncio.run(main())


def test_CAN_26_running_listener_cancels_then_sends_the_send_is_latched():
    async def main():
        model = ScriptedModel(["b", "c"])
        loop = AgentLoop(model)
        live = Live(loop)
        done: list = []

        @loop.on("agent/status")
        def on_status(event):
            if event.status == "running" and not done:
                done.append(1)
                loop.cancel()
                loop.followup("B")

        loop.followup("A")
        await loop.when_idle()
        assert user_texts(loop.log) == ["B"]
        assert len(model.requests) == 1
        assert count(loop.log, "turn/start") == 1
        assert loop.status == "idle"

        loop.followup("C")
        await loop.when_idle()
        assert user_texts(loop.log) == ["B", "C"]
        assert turn_ends(loop.log) == [COMPLETED, COMPLETED]
        assert live.statuses[-1] == "idle"

    asyncio.run(main())


def test_CAN_28_steer_during_a_hanging_turn_then_cancel_is_dropped():
    async def main():
        model = HangModel(hang={1})
        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("go")
        await model.entered.wait()
        s = loop.steer("steering text")
        loop.cancel()
        await loop.when_idle()
        assert s in live.discarded
        assert not loop.inbox.has_pending
        assert count(loop.log, "turn/start") == 1
        assert "steering text" not in user_texts(loop.log)
        assert len(model.requests) == 1
        assert turn_ends(loop.log) == [aborted(USER)]

    asyncio.run(main())


def test_CAN_31_user_cancel_then_disposal_keeps_the_user_cause():
    async def main():
        model = HangModel()
        loop = AgentLoop(model, log=MemoryStore().create())
        loop.followup("go")
        await model.entered.wait()
        loop.cancel("user")
        await loop.aclose()
        assert turn_ends(loop.log) == [aborted(USER)]

    asyncio.run(main())


SEAMS = ["pre_step", "before_request", "model", "request_error", "tool", "turn_stopping"]


def _seam_loop(seam: str, hook):
    """An AgentLoop whose first turn awaits ``hook(signal)`` inside the named seam (first time
    only); later turns answer plainly. Returns ``(loop, requests)``."""
    requests: list = []
    first = {"done": False}

    def once() -> bool:
        if first["done"]:
            return False
        first["done"] = True
        return True

    async def model(request):
        requests.append(request)
        if len(requests) == 1:
            if seam == "model" and once():
                await hook(request.signal)
            elif seam == "tool":
                return tool_calls(("c1", "work"))
            elif seam == "request_error":
                raise ModelError("flaky")
        return ModelReply(f"reply {len(requests)}")

    loop = AgentLoop(model)

    @loop.tool
    async def work(args, ctx):
        if seam == "tool" and once():
            await hook(ctx.signal)
        return "worked"

    if seam == "pre_step":

        @loop.pre_step
        async def pre(step, next):
            if once():
                await hook(step.signal)
            return await next()
    elif seam == "before_request":

        @loop.before_request
        async def before(request, next):
            if once():
                await hook(request.signal)
            return await next()
    elif seam == "request_error":

        @loop.request_error
        async def recover(failure, next):
            if once():
                await hook(failure.signal)
            return Retry()
    elif seam == "turn_stopping":

        @loop.turn_stopping
        async def stopping(stop):
            if once():
                await hook(stop.signal)

    return loop, requests


def _check_seam_turn(seam: str, loop, requests) -> None:
    """Turn 1 ended aborted{user} at the seam with the right trace; turn 2 completed."""
    log = loop.log
    assert turn_ends(log) == [aborted(USER), COMPLETED]
    assert loop.status == "idle"
    first_end = [e.seq for e in log.events() if e.type == "turn/end"][0]
    turn1 = [e for e in log.events() if e.seq <= first_end]
    steps1 = [e for e in turn1 if e.type == "step/start"]
    assert len(steps1) == (0 if seam == "pre_step" else 1)
    assert len([e for e in turn1 if e.type == "step/end"]) == len(steps1)
    assert len([r for r in requests if r.turn == 1]) == (0 if seam in ("pre_step", "before_request") else 1)
    assistant1 = [e for e in turn1 if e.type == "assistant/message"]
    assert len(assistant1) == (1 if seam in ("tool", "turn_stopping") else 0)
    if seam == "tool":
        result = result_of(log, "c1")
        assert result.data["error"] == {"name": "CancelledError", "code": "ABORTED_DURING_DISPATCH"}
        assert result.data["message"]["content"][0]["isError"] is True
    # the second turn is unaffected by the first one's cancellation
    assert requests[-1].turn == 2 and texts(requests[-1].entered) == ["again"]


@pytest.mark.parametrize("seam", SEAMS)
def test_CAN_32_a_seam_blocked_on_signal_wait_is_released_by_cancel(seam):
    """Reference: the signal releases the waiter and the turn ends aborted{user}. SPEC 4.4: the
    throw comes first, so the waiter sees ``CancelledError`` (not a normal return)."""

    async def main():
        entered = asyncio.Event()
        hits: list = []

        async def hook(signal):
            entered.set()
            try:
                reason = await signal.wait()
            except CancelledError:
                hits.append("cancelled")
                raise
            hits.append(("returned", reason))

        loop, requests = _seam_loop(seam, hook)
        loop.followup("go")
        await entered.wait()
        loop.cancel()
        await loop.when_idle()
        assert hits == ["cancelled"]
        loop.followup("again")
        await loop.when_idle()
        _check_seam_turn(seam, loop, requests)

    asyncio.run(main())


@pytest.mark.parametrize("cause", ["user", "disposed"])
def test_CAN_33_cancel_or_disposal_during_the_pre_step_waterfall(cause):
    """Disposal is ``aclose()`` (cause ``disposed``); the user case calls ``cancel()``."""

    async def main():
        model = ScriptedModel(["never"])
        log = MemoryStore().create()
        loop = AgentLoop(model, log=log)
        entered = asyncio.Event()

        @loop.pre_step
        async def pre(step, next):
            entered.set()
            await forever()

        loop.followup("go")
        await entered.wait()
        if cause == "user":
            loop.cancel()
        else:
            await loop.aclose()
        await loop.when_idle()
        assert types_of(log) == ["agent/inbox/spliced", "turn/start", "agent/inbox/spliced", "turn/end"]
        assert turn_ends(log) == [aborted({"kind": cause})]
        assert model.requests == []

    asyncio.run(main())


def test_CAN_34_pre_step_listener_starts_disposal_then_throws():
    """Disposal's synchronous part is ``cancel("disposed", keep_inbox=True)`` (what ``aclose``
    does first). The throw after it does not turn the aborted turn into an error. Afterwards the
    loop is sound: a later turn's cancel still throws into the model."""

    async def main():
        model = HangModel(hang={1})
        loop = AgentLoop(model)
        live = Live(loop)
        first: list = []

        @loop.pre_step
        async def pre(step, next):
            if not first:
                first.append(1)
                loop.cancel("disposed", keep_inbox=True)
                raise RuntimeError("hook broke after disposal")
            return await next()

        loop.followup("go")
        await loop.when_idle()
        assert types_of(loop.log) == ["agent/inbox/spliced", "turn/start", "agent/inbox/spliced", "turn/end"]
        assert turn_ends(loop.log) == [aborted(DISPOSED)]
        assert live.errors == []

        loop.followup("next")
        await model.entered.wait()
        loop.cancel()
        await loop.when_idle()
        assert model.cancelled == 1
        assert turn_ends(loop.log) == [aborted(DISPOSED), aborted(USER)]

    asyncio.run(main())


def test_CAN_35_tool_injects_then_cancels_with_a_post_execute_context():
    """The tool calls ``cancel()`` and returns its result (with an additional context) without
    awaiting again. Its result is committed (every started call drains and commits, SPEC 4.4: a
    tool that returns commits its result); the injected context was discarded by the cancel;
    the result's context is parked in next-step and enters the next turn on wake."""

    async def main():
        model = ScriptedModel([tool_calls(("c1", "act")), "next turn"])
        loop = AgentLoop(model)
        live = Live(loop)

        @loop.tool
        async def act(args, ctx):
            ctx.loop.inject("injected")
            ctx.loop.cancel()
            return ToolResult("done", additional_contexts=["post"])

        loop.followup("go")
        await loop.when_idle()
        # the tail, leaving out inbox splices (the context's insertion follows its result, 5.8)
        tail = [t for t in types_of(loop.log) if t != "agent/inbox/spliced"][-3:]
        assert tail == ["tool/result", "step/end", "turn/end"], types_of(loop.log)
        result = result_of(loop.log, "c1")
        assert result_text(result) == "done"
        assert "error" not in result.data
        assert [m.text for m in live.discarded] == ["injected"]
        assert texts(loop.inbox.next_step) == ["post"]
        assert turn_ends(loop.log) == [aborted(USER)]
        assert user_texts(loop.log) == ["go"]

        loop.followup("wake")
        await loop.when_idle()
        assert user_texts(loop.log) == ["go", "post", "wake"]
        assert texts(model.requests[1].entered) == ["post", "wake"]

    asyncio.run(main())


def test_CAN_36_two_calls_where_the_second_cancels_both_results_are_logged():
    async def main():
        model = ScriptedModel([tool_calls(("c1", "one"), ("c2", "two"))])
        loop = AgentLoop(model)

        @loop.tool
        async def one(args, ctx):
            return ToolResult("one", additional_contexts=["ctx one"])

        @loop.tool
        async def two(args, ctx):
            ctx.loop.cancel()
            return ToolResult("two", additional_contexts=["ctx two"])

        loop.followup("go")
        await loop.when_idle()
        assert result_text(result_of(loop.log, "c1")) == "one"
        assert result_text(result_of(loop.log, "c2")) == "two"
        assert [e.data["message"]["content"][0]["toolCallId"] for e in of_type(loop.log, "tool/result")] == ["c1", "c2"]
        assert user_texts(loop.log) == ["go"]
        assert turn_ends(loop.log) == [aborted(USER)]

    asyncio.run(main())


def test_CAN_37_disposal_during_a_tool_wait_parks_the_post_execute_context():
    """The tool catches the ``CancelledError`` thrown by disposal and returns a result: it is
    committed (SPEC 4.4) and its context is parked in next-step; no extra turn runs."""

    async def main():
        model = ScriptedModel([tool_calls(("c1", "wait")), "never"])
        log = MemoryStore().create()
        loop = AgentLoop(model, log=log)
        entered = asyncio.Event()

        @loop.tool
        async def wait(args, ctx):
            entered.set()
            try:
                await forever()
            except CancelledError:
                return ToolResult("stopped", additional_contexts=["post"])
            return "unreachable"

        loop.followup("go")
        await entered.wait()
        await loop.aclose()
        result = result_of(log, "c1")
        assert result_text(result) == "stopped" and "error" not in result.data
        assert texts(loop.inbox.next_step) == ["post"]
        assert count(log, "turn/start") == 1
        assert turn_ends(log) == [aborted(DISPOSED)]
        assert len(model.requests) == 1
        assert types_of(log)[-3:] == ["agent/inbox/spliced", "step/end", "turn/end"]

    asyncio.run(main())


def test_CAN_40_disposal_mid_turn():
    """Reference: the queued tail never starts. D7: ``aclose()`` keeps it pending (durably)
    instead of discarding it."""

    async def main():
        model = HangModel()
        log = MemoryStore().create()
        loop = AgentLoop(model, log=log)
        live = Live(loop)
        loop.followup("go")
        tail = loop.followup("queued tail")
        await model.entered.wait()
        await loop.aclose()
        assert live.statuses == ["running", "idle"]
        assert turn_ends(log) == [aborted(DISPOSED)]
        assert user_texts(log) == ["go"]
        assert len(model.requests) == 1
        assert count(log, "turn/start") == 1
        assert loop.inbox.next_turn == (tail,)
        assert canceled_splices(log) == []

    asyncio.run(main())


# --------------------------------------------------------------------------------------------
# SPEC 4.4 cancellation
# --------------------------------------------------------------------------------------------


def cancel_requests(task: Any) -> int:
    """``task.cancelling()``: the cancellation requests pending on ``task`` (Python 3.11+; 3.10
    has no such count, and its tasks read as 0 here)."""
    return task.cancelling() if sys.version_info >= (3, 11) else 0


# Python 3.10 has no Task.cancelling(), so a CancelledError raised by user code cannot be told
# apart from an outside cancellation: it ends the turn aborted/disposed (docs/loop.md).
needs_cancelling = pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() is Python 3.11+")


@pytest.mark.parametrize("where", ["outside", "inside"])
@pytest.mark.parametrize("seam", SEAMS)
def test_cancel_throws_cancelled_error_into_the_awaited_user_code(seam, where):
    """SPEC 4.4: ``cancel()`` throws ``CancelledError`` into whatever the driver awaits — also when
    it is called from inside that very listener, model or tool; the driver absorbs it, ends the
    turn aborted and carries on. The caller's task is never cancelled."""

    async def main():
        entered = asyncio.Event()
        hits: list = []
        holder: Dict[str, AgentLoop] = {}

        async def hook(signal):
            hits.append("entered")
            entered.set()
            try:
                if where == "inside":
                    holder["loop"].cancel()
                await forever()
            except CancelledError:
                hits.append("cancelled")
                raise

        loop, requests = _seam_loop(seam, hook)
        holder["loop"] = loop
        loop.followup("go")
        await entered.wait()
        me = asyncio.current_task()
        if where == "outside":
            loop.cancel()
            assert cancel_requests(me) == 0
            await drain()  # the caller keeps running: no CancelledError lands here
        await loop.when_idle()
        assert hits == ["entered", "cancelled"]
        assert cancel_requests(me) == 0 and not me.cancelled()
        loop.followup("again")
        await loop.when_idle()
        _check_seam_turn(seam, loop, requests)

    asyncio.run(main())


def test_cancel_from_another_task_does_not_cancel_that_task():
    async def main():
        model = HangModel()
        loop = AgentLoop(model)
        loop.followup("go")
        await model.entered.wait()

        async def canceller():
            loop.cancel()
            await drain()
            await drain()
            return cancel_requests(asyncio.current_task())

        assert await asyncio.create_task(canceller()) == 0
        await loop.when_idle()
        assert model.cancelled == 1
        assert turn_ends(loop.log) == [aborted(USER)]

    asyncio.run(main())


@needs_cancelling
@pytest.mark.parametrize("seam", ["pre_step", "before_request", "model", "request_error", "turn_stopping"])
def test_a_cancelled_error_raised_by_user_code_without_a_cancel_fails_the_turn(seam):
    """SPEC 4.4: a ``CancelledError`` raised by user code while no cancellation is in progress fails
    the turn as an error with code ``UNKNOWN`` (it is not an abort, and not a disposal)."""

    async def main():
        raised: list = []

        async def hook(signal):
            raised.append(1)
            raise CancelledError()

        loop, requests = _seam_loop(seam, hook)
        live = Live(loop)
        loop.followup("go")
        await loop.when_idle()
        assert raised == [1]
        [end] = turn_ends(loop.log)
        assert end["kind"] == "error", end
        assert end["error"]["code"] == "UNKNOWN"
        assert len(live.errors) == 1
        assert cancel_requests(asyncio.current_task()) == 0
        loop.followup("again")
        await loop.when_idle()
        assert turn_ends(loop.log)[-1] == COMPLETED

    asyncio.run(main())


@needs_cancelling
def test_a_cancelled_error_raised_by_a_streaming_model_without_a_cancel_fails_the_turn():
    async def main():
        async def model(request):
            yield {"type": "text-delta", "text": "half"}
            raise CancelledError()

        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("go")
        await loop.when_idle()
        [end] = turn_ends(loop.log)
        assert end["kind"] == "error" and end["error"]["code"] == "UNKNOWN", end
        assert of_type(loop.log, "assistant/message") == []  # not an interrupted (aborted) prefix
        [error] = live.errors
        assert isinstance(error.exception, CancelledError)
        assert cancel_requests(asyncio.current_task()) == 0

    asyncio.run(main())


@pytest.mark.parametrize("seam", ["pre_step", "request_error", "turn_stopping"])
def test_cancel_from_a_sync_listener_aborts_the_turn_and_leaves_the_driver_sound(seam):
    """A sync listener that calls ``cancel()`` never awaits, so the throw has nowhere to land in
    it; the turn still ends aborted, and the next turn is neither cancelled nor stuck."""

    async def main():
        fired: list = []
        model = ScriptedModel([ModelError("flaky")] if seam == "request_error" else ["one"])
        model.add("two")
        loop = AgentLoop(model)

        def listener(payload, next=None):
            if not fired:
                fired.append(1)
                loop.cancel()
            if seam == "pre_step":
                return Enter(payload.messages)
            if seam == "request_error":
                return Retry()
            return None

        getattr(loop, seam)(listener)
        loop.followup("go")
        await loop.when_idle()
        assert fired == [1]
        assert turn_ends(loop.log) == [aborted(USER)]
        assert cancel_requests(asyncio.current_task()) == 0
        loop.followup("again")
        await loop.when_idle()
        assert turn_ends(loop.log) == [aborted(USER), COMPLETED]
        assert texts(model.requests[-1].entered) == ["again"]

    asyncio.run(main())


def test_tools_cancelled_mid_run_get_aborted_during_and_unstarted_ones_aborted_before():
    """A started tool ending with CancelledError → ``ABORTED_DURING_DISPATCH`` (name
    ``CancelledError``); a started one that catches it and returns commits its result; calls not
    yet started → synthetic ``tool/call`` + ``ABORTED_BEFORE_DISPATCH``. Results commit in model
    order."""

    async def main():
        model = ScriptedModel([tool_calls(("c1", "slow"), ("c2", "careful"), ("c3", "slow"), ("c4", "careful"))])
        loop = AgentLoop(model, max_parallel_tool_calls=2)
        started: list = []
        both = asyncio.Event()

        @loop.tool
        async def slow(args, ctx):
            started.append(ctx.call_id)
            if len(started) == 2:
                both.set()
            await forever()

        @loop.tool
        async def careful(args, ctx):
            started.append(ctx.call_id)
            if len(started) == 2:
                both.set()
            try:
                await forever()
            except CancelledError:
                return "cleaned up"

        loop.followup("go")
        await both.wait()
        loop.cancel()
        await loop.when_idle()
        assert started == ["c1", "c2"]
        results = of_type(loop.log, "tool/result")
        assert [e.data["message"]["content"][0]["toolCallId"] for e in results] == ["c1", "c2", "c3", "c4"]
        assert results[0].data["error"] == {"name": "CancelledError", "code": "ABORTED_DURING_DISPATCH"}
        assert "error" not in results[1].data and result_text(results[1]) == "cleaned up"
        for r in results[2:]:
            assert r.data["error"]["code"] == "ABORTED_BEFORE_DISPATCH"
            assert r.data["message"]["content"][0]["isError"] is True
        calls = {e.data["callId"]: e.seq for e in of_type(loop.log, "tool/call")}
        assert sorted(calls) == ["c1", "c2", "c3", "c4"]
        for r in results:
            assert r.source_event_seqs == [calls[r.data["message"]["content"][0]["toolCallId"]]]
        assert turn_ends(loop.log) == [aborted(USER)]

    asyncio.run(main())


def test_first_cause_wins_parent_then_user():
    async def main():
        model = HangModel()
        loop = AgentLoop(model)
        loop.followup("go")
        await model.entered.wait()
        signal = model.requests[0].signal
        loop.cancel("parent")
        loop.cancel("user")
        assert signal.reason == PARENT
        await loop.when_idle()
        assert turn_ends(loop.log) == [aborted(PARENT)]
        assert signal.reason == PARENT

    asyncio.run(main())


@pytest.mark.parametrize(
    "cause,stored",
    [
        ("user", USER),
        ("parent", PARENT),
        ("disposed", DISPOSED),
        ({"kind": "hook", "reason": "x"}, {"kind": "hook", "reason": "x"}),
        ({"kind": "budget", "limit": 3}, {"kind": "budget", "limit": 3}),
    ],
)
def test_cancel_causes_are_stored_as_dicts(cause, stored):
    async def main():
        model = HangModel()
        loop = AgentLoop(model)
        loop.followup("go")
        await model.entered.wait()
        signal = model.requests[0].signal
        loop.cancel(cause)
        assert signal.aborted and signal.reason == stored
        with pytest.raises(TurnAborted) as info:
            signal.raise_if_aborted()
        assert info.value.reason == stored
        await loop.when_idle()
        assert turn_ends(loop.log) == [aborted(stored)]

    asyncio.run(main())


def _driver_task(*others: asyncio.Task[Any]) -> asyncio.Task[Any]:
    """The one task besides the current one and ``others``: the AgentLoop's driver."""
    me = asyncio.current_task()
    [task] = [t for t in asyncio.all_tasks() if t is not me and t not in others]
    return task


def test_driver_task_cancelled_from_outside_ends_disposed_and_propagates():
    async def main():
        model = HangModel(hang={1})
        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("go")
        await model.entered.wait()
        driver = _driver_task()
        driver.cancel()
        await asyncio.wait({driver})
        assert driver.cancelled()  # the outside cancellation propagated
        assert model.cancelled == 1
        assert turn_ends(loop.log) == [aborted(DISPOSED)]
        assert loop.status == "idle" and live.statuses == ["running", "idle"]
        assert live.errors == []

        loop.followup("again")
        await loop.when_idle()
        assert turn_ends(loop.log) == [aborted(DISPOSED), COMPLETED]

    asyncio.run(main())


def test_driver_cancelled_from_outside_during_tools_still_commits_every_result():
    """Balanced log (reference 2.5) even for an outside cancellation: the started call drains
    with ``ABORTED_DURING_DISPATCH``, the unstarted one gets ``ABORTED_BEFORE_DISPATCH``."""

    async def main():
        model = ScriptedModel([tool_calls(("c1", "block"), ("c2", "block")), "again"])
        loop = AgentLoop(model, max_parallel_tool_calls=1)
        entered = asyncio.Event()
        tool_tasks: list = []

        @loop.tool
        async def block(args, ctx):
            tool_tasks.append(asyncio.current_task())
            entered.set()
            await forever()

        loop.followup("go")
        await entered.wait()
        driver = _driver_task(*tool_tasks)
        driver.cancel()
        await asyncio.wait({driver})
        assert driver.cancelled()
        assert result_of(loop.log, "c1").data["error"] == {"name": "CancelledError", "code": "ABORTED_DURING_DISPATCH"}
        assert result_of(loop.log, "c2").data["error"]["code"] == "ABORTED_BEFORE_DISPATCH"
        assert [e.type for e in loop.log.events()][-2:] == ["step/end", "turn/end"]
        assert turn_ends(loop.log) == [aborted(DISPOSED)]
        assert loop.status == "idle"

    asyncio.run(main())


def test_event_loop_shutdown_ends_the_open_turn_disposed():
    log = MemoryStore().create()
    seen: Dict[str, Any] = {}

    async def main():
        model = HangModel()
        loop = AgentLoop(model, log=log)
        seen["model"] = model
        loop.followup("go")
        await model.entered.wait()
        # returning leaves the driver pending: asyncio.run cancels it at shutdown

    asyncio.run(main())
    assert seen["model"].cancelled == 1
    assert turn_ends(log) == [aborted(DISPOSED)]
    assert boundaries(log) == ["turn/start", "step/start", "step/end", "turn/end"]


def test_cancel_from_a_log_observer_aborts_even_when_discarding_fails(caplog: Any) -> None:
    """SPEC 3.8/4.4 do not say what happens when ``cancel()``'s inbox clear cannot append (from
    a log observer, appends are reentrant): the turn is still aborted, then the clear's
    ``ReentrantAppendError`` is raised to the caller (here contained and logged by the log)."""

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        return kerman.ModelReply("never")

    async def main() -> None:
        loop = kerman.AgentLoop(model)

        def observer(event: kerman.Event) -> None:
            if event.type == "step/start":
                loop.cancel()

        loop.log.subscribe(observer)
        loop.followup("go")
        loop.inject("pending context")  # claimed at the next boundary only: the clear has work
        await loop.when_idle()
        ends = [e.data["reason"] for e in loop.log.events(types="turn/end")]
        assert ends == [{"kind": "aborted", "reason": {"kind": "user"}}]
        assert [m.text for m in loop.inbox.next_step] == ["pending context"]

    with caplog.at_level(logging.ERROR, logger="kerman"):
        asyncio.run(main())
    assert any("ReentrantAppendError" in r.getMessage() or "reenter" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------------------------
# SPEC 4.5 Signal
# --------------------------------------------------------------------------------------------


def test_signal_callbacks_run_synchronously_on_abort_and_at_once_when_already_aborted():
    async def main():
        loop = AgentLoop(ScriptedModel(["never"]))
        entered = asyncio.Event()
        calls: list = []
        later: list = []
        state: Dict[str, Any] = {}

        @loop.pre_step
        async def pre(step, next):
            signal = step.signal
            state["signal"] = signal
            assert not signal.aborted and signal.reason is None
            signal.raise_if_aborted()  # no-op while live
            signal.add_callback(lambda reason: calls.append(("first", reason)))
            signal.add_callback(lambda reason: calls.append(("second", reason)))
            entered.set()
            try:
                await forever()
            except CancelledError:
                signal.add_callback(later.append)
                state["later_at_once"] = list(later)
                with pytest.raises(TurnAborted) as info:
                    signal.raise_if_aborted()
                state["aborted_reason"] = info.value.reason
                raise

        loop.followup("go")
        await entered.wait()
        loop.cancel("parent")
        # synchronously, before cancel() returned
        assert calls == [("first", PARENT), ("second", PARENT)]
        loop.cancel("user")
        assert len(calls) == 2  # a later cause neither re-runs callbacks nor changes the reason
        await loop.when_idle()
        assert state["later_at_once"] == [PARENT]
        assert state["aborted_reason"] == PARENT
        assert state["signal"].reason == PARENT and state["signal"].aborted
        assert issubclass(TurnAborted, KermanError)

    asyncio.run(main())


def test_one_signal_per_turn_shared_by_every_seam():
    async def main():
        seen: list = []

        async def model(request):
            seen.append(("model", request.turn, request.signal))
            if request.step == 1 and request.turn == 1:
                return tool_calls(("c1", "t"))
            return ModelReply("ok")

        loop = AgentLoop(model)

        @loop.tool
        async def t(args, ctx):
            seen.append(("tool", ctx.turn, ctx.signal))
            return "x"

        @loop.pre_step
        async def pre(step, next):
            seen.append(("pre", step.turn, step.signal))
            return await next()

        @loop.turn_stopping
        async def stopping(stop):
            seen.append(("stop", stop.turn, stop.signal))

        loop.followup("one")
        await loop.when_idle()
        loop.followup("two")
        await loop.when_idle()
        turn1 = {id(s) for _, turn, s in seen if turn == 1}
        turn2 = {id(s) for _, turn, s in seen if turn == 2}
        assert len(turn1) == 1 and len(turn2) == 1 and turn1 != turn2
        assert {k for k, turn, _ in seen if turn == 1} == {"model", "tool", "pre", "stop"}

    asyncio.run(main())


# --------------------------------------------------------------------------------------------
# keep_inbox and the wake latch (reference 3.8, 5.9)
# --------------------------------------------------------------------------------------------


def test_idle_cancel_durably_discards_pending_input_next_step_first():
    async def main():
        loop = AgentLoop(ScriptedModel([]))
        live = Live(loop)
        ctx = loop.inject("context")
        queued = loop.send("queued", NEXT_TURN, False)
        before = len(loop.log)
        loop.cancel("user", keep_inbox=True)
        assert len(loop.log) == before and loop.inbox.has_pending
        loop.cancel()
        assert [(d["target"], d["removedCount"]) for d in canceled_splices(loop.log)] == [(NEXT_STEP, 1), (NEXT_TURN, 1)]
        assert live.discarded == [ctx, queued]
        assert not loop.inbox.has_pending
        assert count(loop.log, "turn/start") == 0 and loop.status == "idle"

    asyncio.run(main())


def test_steer_after_the_abort_becomes_a_new_turn():
    async def main():
        model = HangModel(hang={1})
        loop = AgentLoop(model)
        loop.followup("A")
        await model.entered.wait()
        loop.cancel()
        s = loop.steer("S")
        assert loop.inbox.next_turn == (s,) and loop.inbox.next_step == ()
        await loop.when_idle()
        assert turn_ends(loop.log) == [aborted(USER), COMPLETED]
        assert [(r.turn, texts(r.entered)) for r in model.requests] == [(1, ["A"]), (2, ["S"])]

    asyncio.run(main())


def test_removing_the_latched_message_suppresses_the_replay():
    async def main():
        model = HangModel(hang={1})
        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("A")
        await model.entered.wait()
        loop.cancel()
        b = loop.followup("B")
        assert loop.inbox.remove(b.id)
        await loop.when_idle()
        assert count(loop.log, "turn/start") == 1
        assert live.statuses == ["running", "idle"]

    asyncio.run(main())


def test_keep_inbox_cancel_keeps_the_latch():
    async def main():
        model = HangModel(hang={1})
        loop = AgentLoop(model)
        loop.followup("A")
        await model.entered.wait()
        loop.cancel()
        loop.followup("B")  # latched
        loop.cancel("parent", keep_inbox=True)  # neither clears nor resets the latch
        await loop.when_idle()
        assert user_texts(loop.log) == ["A", "B"]
        assert turn_ends(loop.log) == [aborted(USER), COMPLETED]

    asyncio.run(main())


def test_when_idle_follows_a_turn_started_at_convergence():
    async def main():
        entered = [asyncio.Event(), asyncio.Event()]
        release = asyncio.Event()
        requests: list = []

        async def model(request):
            requests.append(request)
            entered[len(requests) - 1].set()
            if len(requests) == 1:
                await forever()
            await release.wait()
            return ModelReply("ok")

        loop = AgentLoop(model)
        loop.followup("A")
        await entered[0].wait()
        waiter = asyncio.create_task(loop.when_idle())
        loop.cancel()
        loop.followup("B")  # latched: replayed by the exiting driver
        await entered[1].wait()  # turn 1 has ended; turn 2 is in its model call
        assert turn_ends(loop.log) == [aborted(USER)]
        for _ in range(5):  # let the waiter react to the first driver's end
            await drain()
        assert not waiter.done()
        release.set()
        await waiter
        assert turn_ends(loop.log) == [aborted(USER), COMPLETED]
        assert loop.status == "idle"

    asyncio.run(main())
