"""AgentLoop cancellation, errors, resume and crash recovery.

Reference cases (``reference-behavior.md`` 7.5, 7.6, 7.9): CAN-*, ERR-*, RS-*, CR-*, each test named
after its case id. SPEC.md wins where they disagree; where a decision (SPEC 3, D1-D11) or a
clarification (SPEC 4) changes a reference case, the test checks the decided behaviour and says so.
Then SPEC-specific behaviour: 4.4 (cancellation throws ``CancelledError`` into awaited user code),
4.5 (Signal), keep_inbox and the wake latch (reference 5.9), ``when_idle`` (5.10), ``aclose``
(D7), resume (D11, reference 2.11), crash closers on reopen (2.10), ``requeue_claimed`` (D9),
checkpoint durability, and asyncio integration (SPEC 4.3).

Every test drives its own event loop with ``asyncio.run`` and synchronises through
``asyncio.Event``/futures or ``threading.Event`` handshakes, never through sleeps.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

import kerman
from conftest import event_record, header_record, plain, read_raw_session, session_path, write_raw_session
from kerman import (
    NEXT_STEP,
    NEXT_TURN,
    AgentLoop,
    Enter,
    FileStore,
    KermanError,
    LoopError,
    MemoryStore,
    ModelError,
    ModelReply,
    Retry,
    ToolResult,
    ToolResultMessage,
    TurnAborted,
    UserMessage,
)
from kerman.models import ScriptedModel

CancelledError = asyncio.CancelledError

USER = {"kind": "user"}
PARENT = {"kind": "parent"}
DISPOSED = {"kind": "disposed"}
COMPLETED = {"kind": "completed"}
BOUNDARIES = ("turn/start", "step/start", "step/end", "turn/end")


def aborted(cause: Dict[str, Any]) -> Dict[str, Any]:
    return {"kind": "aborted", "reason": cause}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def types_of(log, start: int = 0) -> List[str]:
    return [e.type for e in log.events(start)]


def of_type(log, *types: str) -> list:
    return [e for e in log.events() if e.type in types]


def boundaries(log) -> List[str]:
    return [e.type for e in log.events() if e.type in BOUNDARIES]


def turn_ends(log) -> List[Dict[str, Any]]:
    """The turns' endings, without the report of a user exception (test_user_errors.py)."""
    return [plain(e.data["reason"]) for e in log.events() if e.type == "turn/end"]


def count(log, type_: str) -> int:
    return sum(1 for e in log.events() if e.type == type_)


def user_texts(log) -> List[str]:
    return [kerman.Message.from_dict(e.data).text for e in log.events() if e.type == "user/message"]


def texts(messages) -> List[str]:
    return [m.text for m in messages]


def canceled_splices(log) -> list:
    return [e.data for e in log.splices() if e.data.get("outcome") == "canceled"]


def tool_calls(*calls) -> ModelReply:
    """A reply with one tool-call block per ``(id, name)`` or ``(id, name, arguments)``."""
    return ModelReply([{"type": "tool-call", "id": c[0], "name": c[1], "arguments": c[2] if len(c) > 2 else "{}"}
                       for c in calls])


def result_of(log, call_id: str):
    """The ``tool/result`` event for ``call_id`` (asserts there is exactly one)."""
    found = [e for e in log.events() if e.type == "tool/result" and e.data["message"]["content"][0]["toolCallId"] == call_id]
    assert len(found) == 1, f"expected one tool/result for {call_id}, got {len(found)}: {types_of(log)}"
    return found[0]


def result_text(event) -> str:
    block = event.data["message"]["content"][0]
    content = block["content"]
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content)


async def forever() -> None:
    """Awaits a future nobody resolves: only a cancellation gets out."""
    await asyncio.get_running_loop().create_future()


async def drain() -> None:
    """A barrier behind every callback already scheduled on the running loop (FIFO)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.call_soon(fut.set_result, None)
    await fut


def _in_thread(fn):
    """Runs ``fn`` in another thread while the event loop's thread blocks; returns its value."""
    out: Dict[str, Any] = {}
    done = threading.Event()

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:
            out["error"] = e
        finally:
            done.set()

    threading.Thread(target=run).start()
    done.wait()
    if "error" in out:
        raise out["error"]
    return out.get("value")


class Live:
    """Records the live events of one AgentLoop."""

    def __init__(self, loop: AgentLoop) -> None:
        self.statuses: List[str] = []
        self.errors: list = []
        self.inserted: List[UserMessage] = []
        self.discarded: List[UserMessage] = []
        self.claimed: list = []
        loop.on("agent/status", lambda e: self.statuses.append(e.status))
        loop.on("agent/error", self.errors.append)
        loop.on("agent/inbox/inserted", lambda e: self.inserted.append(e.message))
        loop.on("agent/inbox/discarded", lambda e: self.discarded.append(e.message))
        loop.on("agent/inbox/claimed", lambda e: self.claimed.append((e.message, e.turn)))


class HangModel:
    """Hangs on the requests numbered in ``hang`` (1-based) until cancelled; answers the others
    with ``"reply <n>"``. Records requests and the CancelledErrors it saw."""

    def __init__(self, hang=(1,)) -> None:
        self.hang = set(hang)
        self.requests: list = []
        self.entered = asyncio.Event()
        self.cancelled = 0

    async def __call__(self, request):
        self.requests.append(request)
        n = len(self.requests)
        if n in self.hang:
            self.entered.set()
            try:
                await forever()
            except CancelledError:
                self.cancelled += 1
                raise
        return ModelReply(f"reply {n}")


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
        model = _streaming_hang([
            {"type": "reasoning-delta", "text": "thinking "},
            {"type": "reasoning-delta", "text": "hard"},
            {"type": "usage", **usage},
        ], streamed, requests)
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
        model = _streaming_hang([
            {"type": "text-delta", "text": "keep "},
            {"type": "text-delta", "text": "this"},
            {"type": "tool-call", "id": "c1", "name": "probe", "arguments": "{}"},
        ], streamed, requests)
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
        model = _streaming_hang([{"type": "tool-call", "id": "c1", "name": "probe", "arguments": "{}"}],
                                streamed, requests)
        loop = AgentLoop(model)
        loop.followup("go")
        await streamed.wait()
        loop.cancel()
        await loop.when_idle()
        assert count(loop.log, "assistant/chunk") == 1
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
# 7.6 Errors and recovery (ERR-*)
# --------------------------------------------------------------------------------------------


def test_ERR_01_script_exhausted_reports_one_agent_error():
    async def main():
        loop = AgentLoop(ScriptedModel([]))
        live = Live(loop)
        loop.followup("go")
        await loop.when_idle()
        [error] = live.errors
        assert plain(error.error) == {"message": "script exhausted", "code": "UNKNOWN"}
        assert isinstance(error.exception, ModelError)
        assert error.turn == 1 and error.step == 1
        assert turn_ends(loop.log) == [{"kind": "error", "error": {"message": "script exhausted", "code": "UNKNOWN"}}]
        assert live.statuses == ["running", "idle"]

    asyncio.run(main())


def test_ERR_03_finish_error_keeps_every_failure_field():
    """Wire name ``retryAfterMs`` (SPEC 4.6) instead of ``providerRetryAfterMs``; extra keys of the
    finish chunk's error are kept."""

    async def main():
        failure = {"message": "overloaded", "code": "RATE_LIMITED", "status": 529, "retryAfterMs": 1500,
                   "requestId": "req-7", "vendor": {"x": 1}}
        model = ScriptedModel([[{"type": "text-delta", "text": "par"},
                                {"type": "finish", "reason": "error", "error": failure}]])
        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("go")
        await loop.when_idle()
        assert turn_ends(loop.log) == [{"kind": "error", "error": failure}]
        [error] = live.errors
        assert (error.turn, error.step) == (1, 1)
        assert error.error == failure
        assert error.exception is None
        assert of_type(loop.log, "assistant/message") == []

    asyncio.run(main())


def test_ERR_04_a_provider_abort_finish_is_an_error_not_a_cancellation():
    """Kerman's finish reasons are stop|max-tokens|error; a provider-side abort is a finish with
    reason ``error`` and code ``ABORTED``: the turn ends ``error``, not ``aborted``."""

    async def main():
        failure = {"message": "provider aborted the stream", "code": "ABORTED"}
        model = ScriptedModel([[{"type": "finish", "reason": "error", "error": failure}]])
        loop = AgentLoop(model)
        signals: list = []

        @loop.turn_stopping
        def never(stop):
            signals.append(stop)

        @loop.pre_step
        async def pre(step, next):
            signals.append(step.signal)
            return await next()

        loop.followup("go")
        await loop.when_idle()
        assert turn_ends(loop.log) == [{"kind": "error", "error": failure}]
        assert not signals[0].aborted

    asyncio.run(main())


def test_ERR_05_a_throwing_turn_stopping_listener_fails_the_turn():
    async def main():
        model = ScriptedModel(["one", "two"])
        loop = AgentLoop(model)
        live = Live(loop)
        calls: list = []

        @loop.turn_stopping
        async def stopping(stop):
            calls.append(stop.turn)
            if len(calls) == 1:
                raise RuntimeError("stop hook broke")

        loop.followup("first")
        await loop.when_idle()
        assert turn_ends(loop.log) == [{"kind": "error", "error": {"message": "stop hook broke", "code": "UNKNOWN"}}]
        assert len(live.errors) == 1 and isinstance(live.errors[0].exception, RuntimeError)
        loop.followup("second")
        await loop.when_idle()
        assert turn_ends(loop.log)[-1] == COMPLETED

    asyncio.run(main())


def test_ERR_07_before_request_model_error_is_not_offered_to_request_error():
    """``before_request`` replaces ``agent/request`` (D4)."""

    async def main():
        model = ScriptedModel(["never"])
        loop = AgentLoop(model)
        offered: list = []

        @loop.before_request
        async def middleware(request, next):
            raise ModelError("middleware refused", code="MIDDLEWARE")

        @loop.request_error
        async def recover(failure, next):
            offered.append(failure)
            return Retry()

        loop.followup("go")
        await loop.when_idle()
        assert offered == []
        assert model.requests == []
        assert turn_ends(loop.log) == [{"kind": "error", "error": {"message": "middleware refused", "code": "MIDDLEWARE"}}]

    asyncio.run(main())


def test_ERR_09_a_recovery_listener_that_cancels_and_retries():
    async def main():
        model = ScriptedModel([ModelError("flaky"), "never"])
        loop = AgentLoop(model)
        live = Live(loop)

        @loop.request_error
        async def recover(failure, next):
            loop.cancel()
            return Retry()

        loop.followup("go")
        await loop.when_idle()
        assert len(model.requests) == 1
        assert turn_ends(loop.log) == [aborted(USER)]
        assert live.errors == []
        assert of_type(loop.log, "assistant/message") == []

    asyncio.run(main())


def test_ERR_10_a_recovery_listener_that_throws_ends_the_turn_in_error():
    async def main():
        model = ScriptedModel([ModelError("flaky"), "never"])
        loop = AgentLoop(model)
        live = Live(loop)

        @loop.request_error
        async def recover(failure, next):
            raise RuntimeError("recovery broke")

        loop.followup("go")
        await loop.when_idle()
        assert len(model.requests) == 1
        [end] = turn_ends(loop.log)
        assert end["kind"] == "error"
        assert end["error"]["code"] == "UNKNOWN" and "recovery broke" in end["error"]["message"]
        assert len(live.errors) == 1

    asyncio.run(main())


def test_ERR_13_a_failed_turn_start_append_reports_and_keeps_the_prompt():
    """No pre-commit veto exists; the failing ``turn/start`` append is simulated by closing the log
    from the ``running`` status listener (just before ``turn/start``)."""

    async def main():
        log = MemoryStore().create()
        loop = AgentLoop(ScriptedModel(["never"]), log=log)
        live = Live(loop)

        @loop.on("agent/status")
        def close_log(event):
            if event.status == "running":
                log.close()

        p = loop.followup("go")
        await loop.when_idle()
        assert types_of(log) == ["agent/inbox/spliced"]
        assert loop.inbox.next_turn == (p,)
        [error] = live.errors
        assert error.turn == 0 and error.step == 0
        assert isinstance(error.exception, kerman.LogClosedError)
        assert error.error["code"] == "UNKNOWN"
        assert loop.status == "idle" and live.statuses == ["running", "idle"]
        assert loop.turn == 0

    asyncio.run(main())


def test_ERR_16_a_failed_turn_end_append_is_reported_once_and_the_loop_idles():
    """Simulated veto: a turn_stopping listener closes the log, so ``turn/end`` cannot commit."""

    async def main():
        log = MemoryStore().create()
        model = ScriptedModel(["answer", "more"])
        loop = AgentLoop(model, log=log)
        live = Live(loop)

        @loop.turn_stopping
        def close_log(stop):
            log.close()

        loop.followup("go")
        await loop.when_idle()
        assert types_of(log)[-1] == "step/end"
        [error] = live.errors
        assert isinstance(error.exception, kerman.LogClosedError)
        assert error.turn == 1
        assert loop.status == "idle" and live.statuses == ["running", "idle"]
        assert len(model.requests) == 1

    asyncio.run(main())


def test_ERR_17_a_log_that_fails_mid_step_still_gives_running_then_idle():
    """Simulated permanent veto: the model closes the log, so every later append fails."""

    async def main():
        log = MemoryStore().create()

        async def model(request):
            log.close()
            return ModelReply("lost")

        loop = AgentLoop(model, log=log)
        live = Live(loop)
        loop.followup("go")
        await loop.when_idle()
        assert live.statuses == ["running", "idle"]
        assert live.errors and all(isinstance(e.exception, kerman.LogClosedError) for e in live.errors)
        assert types_of(log)[-1] == "request/header"

    asyncio.run(main())


def test_ERR_18_throwing_observers_never_change_the_outcome(caplog):
    async def main():
        model = ScriptedModel(["one", ModelError("down"), "three"])
        loop = AgentLoop(model)
        live = Live(loop)

        def observer(event):
            if event.type in BOUNDARIES:
                raise RuntimeError(f"observer of {event.type} broke")

        loop.log.subscribe(observer)

        @loop.on("agent/error")
        def broken(event):
            raise RuntimeError("agent/error listener broke")

        loop.followup("first")
        await loop.when_idle()
        assert boundaries(loop.log) == ["turn/start", "step/start", "step/end", "turn/end"]
        assert turn_ends(loop.log) == [COMPLETED]
        assert live.errors == []

        loop.followup("second")  # the model fails: agent/error with a throwing listener
        await loop.when_idle()
        assert turn_ends(loop.log)[-1]["kind"] == "error"
        assert len(live.errors) == 1

        loop.followup("third")
        await loop.when_idle()
        assert turn_ends(loop.log)[-1] == COMPLETED
        assert count(loop.log, "turn/start") == count(loop.log, "turn/end") == 3
        assert count(loop.log, "step/start") == count(loop.log, "step/end") == 3

    with caplog.at_level(logging.CRITICAL, logger="kerman"):
        asyncio.run(main())


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
                ("UserMessage", "first prompt"), ("AssistantMessage", "first reply"), ("UserMessage", "second prompt")]
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
        assert types_of(copy) == ["agent/inbox/spliced", "turn/start", "agent/inbox/spliced", "step/start",
                                  "user/message", "request/header", "step/end", "turn/end"]
        assert turn_ends(copy) == [{"kind": "interrupted"}]
    finally:
        copy.close()


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
    am = {"id": "a-1", "role": "assistant", "source": {"kind": "model"},
          "content": [{"type": "text", "text": "working"},
                      {"type": "tool-call", "id": "c1", "name": "write", "arguments": "{}"},
                      {"type": "tool-call", "id": "c2", "name": "read", "arguments": "{}"}]}
    user = {"id": "u-1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
    write_raw_session(session_path(root, "crash"), header_record("crash"), [
        event_record(0, "turn/start", {"turn": 1}),
        event_record(1, "step/start", {"turn": 1, "step": 1}),
        event_record(2, "user/message", user, surface_op="append"),
        event_record(3, "assistant/message", {"turn": 1, "step": 1, "message": am}, surface_op="append",
                     source_event_seqs=[]),
        event_record(4, "tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "write", "arguments": "{}"}),
    ])

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
# SPEC 4.4 cancellation
# --------------------------------------------------------------------------------------------


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
            assert me.cancelling() == 0
            await drain()  # the caller keeps running: no CancelledError lands here
        await loop.when_idle()
        assert hits == ["entered", "cancelled"]
        assert me.cancelling() == 0 and not me.cancelled()
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
            return asyncio.current_task().cancelling()

        assert await asyncio.create_task(canceller()) == 0
        await loop.when_idle()
        assert model.cancelled == 1
        assert turn_ends(loop.log) == [aborted(USER)]

    asyncio.run(main())


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
        assert asyncio.current_task().cancelling() == 0
        loop.followup("again")
        await loop.when_idle()
        assert turn_ends(loop.log)[-1] == COMPLETED

    asyncio.run(main())


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
        assert asyncio.current_task().cancelling() == 0

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
        assert asyncio.current_task().cancelling() == 0
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


@pytest.mark.parametrize("cause,stored", [
    ("user", USER),
    ("parent", PARENT),
    ("disposed", DISPOSED),
    ({"kind": "hook", "reason": "x"}, {"kind": "hook", "reason": "x"}),
    ({"kind": "budget", "limit": 3}, {"kind": "budget", "limit": 3}),
])
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
            assert [(d["target"], d["start"], d.get("removedCount", 0), [m["id"] for m in d["inserted"]])
                    for d in new] == [(NEXT_STEP, 0, 0, [requeued[0].id]), (NEXT_TURN, 0, 0, [requeued[1].id])]
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


# --------------------------------------------------------------------------------------------
# asyncio integration (SPEC 4.3)
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.TaskGroup needs Python 3.11")
def test_task_group_user_code_alongside_the_loop_and_cancelled_inside_a_tool():
    async def main():
        model = ScriptedModel([tool_calls(("c1", "fan_out")), "summary", tool_calls(("c2", "fan_out"))])
        loop = AgentLoop(model)
        side = asyncio.Event()
        children = asyncio.Event()
        sub_cancelled: list = []
        runs: list = []

        @loop.tool
        async def fan_out(args, ctx):
            runs.append(ctx.call_id)

            async def sub(i):
                if len(runs) == 1:
                    return i * 2
                children.set()
                try:
                    await forever()
                except CancelledError:
                    sub_cancelled.append(i)
                    raise

            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(sub(i)) for i in range(3)]
            return ",".join(str(t.result()) for t in tasks)

        async with asyncio.TaskGroup() as outer:
            outer.create_task(side.wait())
            loop.followup("fan out")
            await loop.when_idle()
            assert result_text(result_of(loop.log, "c1")) == "0,2,4"
            assert turn_ends(loop.log) == [COMPLETED]

            loop.followup("again")
            await children.wait()
            loop.cancel()
            await loop.when_idle()
            side.set()
        assert sorted(sub_cancelled) == [0, 1, 2]
        assert result_of(loop.log, "c2").data["error"] == {"name": "CancelledError", "code": "ABORTED_DURING_DISPATCH"}
        assert turn_ends(loop.log) == [COMPLETED, aborted(USER)]

    asyncio.run(main())


def test_under_uvloop():
    uvloop = pytest.importorskip("uvloop")

    async def main():
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        model = HangModel(hang={2})
        loop = AgentLoop(model)
        loop.followup("first")
        await loop.when_idle()
        loop.followup("second")
        await model.entered.wait()
        loop.cancel()
        await loop.when_idle()
        assert model.cancelled == 1
        assert turn_ends(loop.log) == [COMPLETED, aborted(USER)]

        claimed = asyncio.Event()
        loop.on("agent/inbox/claimed", lambda e: claimed.set() if e.message.text == "from thread" else None)
        _in_thread(lambda: loop.followup("from thread"))
        await claimed.wait()  # the wake ran on the loop
        await loop.when_idle()
        assert user_texts(loop.log)[-1] == "from thread"
        assert turn_ends(loop.log)[-1] == COMPLETED

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def test_followup_from_another_thread_inserts_at_once_and_wakes_on_the_loop():
    async def main():
        called = asyncio.Event()
        threads: Dict[str, set] = {"model": set(), "listener": set()}

        async def model(request):
            threads["model"].add(threading.get_ident())
            called.set()
            return ModelReply("ok")

        loop = AgentLoop(model)
        loop.on("agent/inbox/inserted", lambda e: threads["listener"].add(threading.get_ident()))
        loop_thread = threading.get_ident()
        seen: Dict[str, Any] = {}
        done = threading.Event()

        def worker():
            try:
                m = loop.followup("from thread")
                seen["pending"] = m in loop.inbox.next_turn
                seen["status"] = loop.status
                seen["types"] = types_of(loop.log)
            except BaseException as e:  # pragma: no cover - reported below
                seen["error"] = e
            finally:
                done.set()

        threading.Thread(target=worker).start()
        done.wait()  # the event loop is blocked: the wake can only be pending
        assert "error" not in seen, seen.get("error")
        assert seen == {"pending": True, "status": "idle", "types": ["agent/inbox/spliced"]}
        await called.wait()
        await loop.when_idle()
        assert turn_ends(loop.log) == [COMPLETED]
        assert threads["model"] == {loop_thread}
        assert threads["listener"] == {loop_thread}

    asyncio.run(main())


def test_steer_and_cancel_from_another_thread():
    async def main():
        release = asyncio.Event()
        called = [asyncio.Event() for _ in range(3)]
        requests: list = []

        async def model(request):
            requests.append(request)
            called[len(requests) - 1].set()
            if len(requests) == 1:
                await release.wait()
            if len(requests) == 3:
                await forever()
            return ModelReply(f"reply {len(requests)}")

        loop = AgentLoop(model)
        loop.followup("go")
        await called[0].wait()
        pending = _in_thread(lambda: (loop.steer("steering"), loop.inbox.next_step)[1])
        assert texts(pending) == ["steering"]  # inserted at once, from the thread
        release.set()
        await loop.when_idle()
        assert [(r.step, texts(r.entered)) for r in requests] == [(1, ["go"]), (2, ["steering"])]

        loop.followup("hang")
        await called[2].wait()
        signal = requests[2].signal
        aborted_in_thread = _in_thread(lambda: (loop.cancel("parent"), signal.aborted)[1])
        assert aborted_in_thread is False  # scheduled onto the loop, not applied from the thread
        await loop.when_idle()
        assert signal.reason == PARENT
        assert turn_ends(loop.log) == [COMPLETED, aborted(PARENT)]

    asyncio.run(main())


def test_a_thread_wake_before_the_loop_was_ever_bound_raises_before_inserting():
    loop = AgentLoop(ScriptedModel(["ok"]))  # constructed with no running event loop: unbound

    async def main():
        errors: list = []

        def worker():
            for call in (lambda: loop.followup("early"), lambda: loop.steer("early"), loop.wake):
                try:
                    call()
                except LoopError as e:
                    errors.append(e)

        loop.inject("context")  # non-waking: allowed, makes wake() have work
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert len(errors) == 3
        assert texts(loop.inbox.next_step) == ["context"] and loop.inbox.next_turn == ()
        assert types_of(loop.log) == ["agent/inbox/spliced"]
        loop.followup("bound now")  # binds to this loop
        await loop.when_idle()
        assert user_texts(loop.log) == ["context", "bound now"]

    asyncio.run(main())


def test_waking_with_no_event_loop_at_all_raises_loop_error():
    loop = AgentLoop(ScriptedModel(["ok"]))
    with pytest.raises(LoopError, match="async"):
        loop.followup("x")
    with pytest.raises(LoopError):
        loop.steer("x")
    with pytest.raises(LoopError):
        loop.send("x", NEXT_TURN, True)
    assert len(loop.log) == 0 and not loop.inbox.has_pending
    loop.inject("context")  # non-waking delivery needs no event loop
    assert len(loop.log) == 1
    with pytest.raises(LoopError):
        loop.wake()
    assert loop.status == "idle" and count(loop.log, "turn/start") == 0


def test_contextvars_set_before_next_are_seen_downstream():
    var: contextvars.ContextVar[str] = contextvars.ContextVar("kerman_test_var", default="unset")

    async def main():
        loop = AgentLoop(ScriptedModel(["ok"]))
        seen: list = []

        @loop.pre_step
        async def outer(step, next):
            var.set("from outer")
            return await next()

        @loop.pre_step
        async def inner(step, next):
            seen.append(var.get())
            return await next()

        loop.followup("go")
        await loop.when_idle()
        assert seen == ["from outer"]
        assert turn_ends(loop.log) == [COMPLETED]

    asyncio.run(main())


class _Boom(Exception):
    pass


class _RateLimited(ModelError):
    pass


@pytest.mark.parametrize("exc,failure", [
    (_Boom("boom"), {"message": "boom", "code": "UNKNOWN"}),
    (_RateLimited("slow down", code="RATE_LIMITED", status=429, retry_after_ms=250),
     {"message": "slow down", "code": "RATE_LIMITED", "status": 429, "retryAfterMs": 250}),
])
def test_a_failing_model_keeps_its_exception_type_in_agent_error(exc, failure):
    async def main():
        async def model(request):
            raise exc

        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("go")
        await loop.when_idle()
        [error] = live.errors
        assert error.exception is exc and type(error.exception) is type(exc)
        assert plain(error.error) == failure
        assert error.error["exceptionType"] == type(exc).__name__
        assert error.type == "agent/error" and error.loop is loop
        assert turn_ends(loop.log) == [{"kind": "error", "error": failure}]

    asyncio.run(main())


def test_agent_error_reports_the_turn_and_the_last_entered_step():
    async def main():
        model = ScriptedModel(["plain", tool_calls(("c1", "t")), "unused"])
        loop = AgentLoop(model)
        live = Live(loop)
        proposals: list = []

        @loop.tool
        async def t(args, ctx):
            return "x"

        @loop.pre_step
        async def pre(step, next):
            proposals.append((step.turn, step.step))
            if (step.turn, step.step) in ((2, 2), (3, 1)):
                raise RuntimeError(f"fail at {step.turn}.{step.step}")
            return await next()

        loop.followup("one")
        await loop.when_idle()
        loop.followup("two")  # step 1 calls a tool; the step-2 proposal fails
        await loop.when_idle()
        loop.followup("three")  # the first proposal fails
        await loop.when_idle()
        assert proposals == [(1, 1), (2, 1), (2, 2), (3, 1)]
        assert [(e.turn, e.step) for e in live.errors] == [(2, 1), (3, 0)]
        assert [plain(e.error) for e in live.errors] == [{"message": "fail at 2.2", "code": "UNKNOWN"},
                                                  {"message": "fail at 3.1", "code": "UNKNOWN"}]

    asyncio.run(main())
