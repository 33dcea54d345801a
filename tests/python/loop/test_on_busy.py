"""Double-texting: ``AgentLoop(on_busy=...)`` and ``loop.followup(..., on_busy=...)``
(docs/context.md, "Double-texting").

Each policy meets a followup arriving at every point of a turn: while the loop is idle (before
any claim), while ``pre_step`` runs (claimed, no step yet), during the model's stream (after a
visible chunk), while a tool runs, while the step waits for a decision, and while
``turn_stopping`` runs (the reply is in, the turn about to end). The turn is held at the point
by a future the test owns; nothing sleeps.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import pytest

import kerman
from conftest import plain
from kerman import AgentLoop, BusyError, MemoryStore
from loop.loop_helpers import forever

POINTS = ("idle", "pre_step", "stream", "tool", "decision", "turn_end")
POLICIES = ("enqueue", "reject", "interrupt", "rollback")


def history_texts(request: Any) -> List[str]:
    out = []
    for m in request.messages:
        if isinstance(m, kerman.ToolResultMessage):
            out.append(f"result:{m.call_id}")
        else:
            out.append(m.text)
    return out


class Held:
    """A loop whose turn for the prompt ``"first"`` stops at ``point`` until released (or
    cancelled). Records the history of every request."""

    def __init__(self, point: str, on_busy: str = "enqueue") -> None:
        self.point = point
        self.reached = asyncio.Event()
        self.release = asyncio.get_running_loop().create_future()
        self.requests: List[List[str]] = []
        self.first_turn = -1  # the turn of "first", once start() sent it
        self.loop = AgentLoop(self.model, MemoryStore().create("s"), on_busy=on_busy)  # type: ignore[arg-type]
        loop = self.loop

        @loop.tool(needs_approval=point == "decision")
        async def work() -> str:
            """Works."""
            if self.point == "tool":
                await self.hold()
            return "worked"

        @loop.pre_step
        async def pre_step(step: Any, next: Any) -> Any:
            if self.point == "pre_step" and self.first_turn_step1(step):
                await self.hold()
            return await next()

        @loop.turn_stopping
        async def stopping(stop: Any) -> None:
            if self.point == "turn_end" and self.in_first_turn():
                await self.hold()

    def in_first_turn(self) -> bool:
        return self.loop.turn == self.first_turn

    def first_turn_step1(self, step: Any) -> bool:
        return self.in_first_turn() and self.loop.step == 0

    async def hold(self) -> None:
        self.reached.set()
        await self.release

    async def model(self, request: Any):  # type: ignore[no-untyped-def]
        texts = history_texts(request)
        self.requests.append(texts)
        last = texts[-1]
        if last == "first" and self.point in ("tool", "decision"):
            yield {"type": "tool-call", "id": "c1", "name": "work", "arguments": "{}"}
        elif last == "first" and self.point == "stream":
            yield {"type": "text-delta", "text": "par"}
            await self.hold()
            yield {"type": "text-delta", "text": "tial"}
        else:
            yield {"type": "text-delta", "text": f"re:{last}"}
        yield {"type": "finish", "reason": "stop"}

    async def start(self) -> None:
        """Turn 1 ("hello") completes; turn 2 ("first") runs to the point and stops there."""
        self.loop.followup("hello")
        await self.loop.when_idle()
        self.first_turn = self.loop.turn + 1
        self.loop.followup("first", on_busy="enqueue")
        if self.point == "idle":
            await self.loop.when_idle()
            return
        if self.point == "decision":
            await self.loop.when_idle()
            assert self.loop.status == "waiting"
            return
        await self.reached.wait()
        assert self.loop.status == "running"

    def finish(self) -> None:
        if not self.release.done():
            self.release.set_result(None)
        if self.point == "decision" and self.loop.decisions:
            self.loop.decide(self.loop.decisions[0].decision_id, kerman.Approve())


def endings(log: Any) -> List[Dict[str, Any]]:
    return [plain(e.data["reason"]) for e in log.events() if e.type == "turn/end"]


def run(point: str, policy: str) -> Held:
    async def main() -> Held:
        held = Held(point)
        await held.start()
        splices = len(list(held.loop.log.splices()))
        if policy == "reject" and point != "idle":
            with pytest.raises(BusyError) as raised:
                held.loop.followup("second", on_busy="reject")
            assert raised.value.session_id == "s" and raised.value.turn == held.first_turn
            assert 'on_busy="reject"' in str(raised.value) and "'s'" in str(raised.value)
            assert len(list(held.loop.log.splices())) == splices, "nothing was queued"
            assert not held.loop.inbox.has_pending
        else:
            held.loop.followup("second", on_busy=policy)  # type: ignore[arg-type]
        if policy in ("enqueue", "reject") or point == "idle":
            held.finish()
        await held.loop.when_idle()
        if held.loop.status == "waiting":  # a decision of the enqueued turn's own? never: one tool call
            pytest.fail(f"left waiting: {held.loop.decisions}")
        await held.loop.aclose()
        return held

    return asyncio.run(main())


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("policy", POLICIES)
def test_a_followup_at_every_point_of_a_turn(point: str, policy: str) -> None:
    held = run(point, policy)
    log = held.loop.log
    ends = endings(log)
    completed = {"kind": "completed"}
    last_request = held.requests[-1]
    before = ["hello", "re:hello"]
    # The history the "first" turn leaves when it runs to its end ("" is the reply that only
    # called the tool) and when it is cut at the point (a prompt claimed in pre_step was never
    # entered: it is not a message; a cut stream keeps what was visible).
    whole = {
        "idle": ["first", "re:first"],
        "pre_step": ["first", "re:first"],
        "stream": ["first", "partial"],
        "tool": ["first", "", "result:c1", "re:result:c1"],
        "decision": ["first", "", "result:c1", "re:result:c1"],
        "turn_end": ["first", "re:first"],
    }[point]
    cut = {
        "pre_step": [],
        "stream": ["first", "par"],
        "tool": ["first", "", "result:c1"],
        "decision": ["first", "", "result:c1"],
        "turn_end": ["first", "re:first"],
    }.get(point)
    if point == "idle" or policy == "enqueue":
        # Queued behind the turn, which completes; the followup runs as the next turn.
        assert ends == [completed, completed, completed]
        assert last_request == before + whole + ["second"]
        return
    if policy == "reject":
        assert ends == [completed, completed]
        assert all("second" not in r for r in held.requests)
        return
    assert ends == [completed, {"kind": "aborted", "reason": {"kind": policy}}, completed]
    if policy == "interrupt":
        # The cut turn stays in the history: its prompt and what it logged before the cancel.
        assert last_request == before + cut + ["second"]
    else:
        # The session goes on from before the rolled-back turn, whose events stay in the log.
        assert last_request == before + ["second"]
        prompts = [e.data["content"][0]["text"] for e in log.events() if e.type == "user/message"]
        assert prompts == (["hello", "second"] if point == "pre_step" else ["hello", "first", "second"])


def test_the_loop_policy_is_the_default_and_a_message_may_override_it() -> None:
    async def main() -> None:
        held = Held("stream", on_busy="reject")
        await held.start()
        with pytest.raises(BusyError):
            held.loop.followup("second")
        held.loop.followup("third", on_busy="rollback")
        await held.loop.when_idle()
        assert held.requests[-1] == ["hello", "re:hello", "third"]
        # Idle: a rejecting loop takes the followup.
        held.loop.followup("fourth")
        await held.loop.when_idle()
        assert held.requests[-1][-1] == "fourth"
        await held.loop.aclose()

    asyncio.run(main())


def test_a_bad_policy_is_refused_naming_it() -> None:
    async def model(request: Any) -> Any:
        await forever()

    with pytest.raises(ValueError, match="'later'"):
        AgentLoop(model, on_busy="later")  # type: ignore[arg-type]
    loop = AgentLoop(model)
    assert loop.on_busy == "enqueue" and "on_busy" not in repr(loop)
    assert "on_busy='rollback'" in repr(AgentLoop(model, on_busy="rollback"))
    with pytest.raises(ValueError, match="'never'"):
        loop.followup("x", on_busy="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'sometimes'"):
        loop.on_busy = "sometimes"  # type: ignore[assignment]
    assert not loop.inbox.has_pending


def test_a_rolled_back_turn_stays_out_of_a_resumed_loops_history() -> None:
    async def main() -> None:
        held = Held("tool")
        await held.start()
        held.loop.followup("second", on_busy="rollback")
        await held.loop.when_idle()
        log = held.loop.log
        await held.loop.aclose()
        seen: List[List[str]] = []

        async def model(request: Any) -> Any:
            seen.append(history_texts(request))
            return kerman.ModelReply("ok")

        again = AgentLoop(model, log)
        again.followup("third")
        await again.when_idle()
        assert seen == [["hello", "re:hello", "second", "re:second", "third"]]
        await again.aclose()

    asyncio.run(main())


def test_a_followup_from_another_thread_is_applied_on_the_loops_thread() -> None:
    async def main() -> None:
        held = Held("tool")
        await held.start()
        with pytest.raises(BusyError):
            await asyncio.to_thread(held.loop.followup, "no", on_busy="reject")
        assert not held.loop.inbox.has_pending
        sent = await asyncio.to_thread(held.loop.followup, "second", on_busy="rollback")
        assert sent.text == "second"
        await held.loop.when_idle()
        assert endings(held.loop.log)[1] == {"kind": "aborted", "reason": {"kind": "rollback"}}
        assert held.requests[-1] == ["hello", "re:hello", "second"]
        await held.loop.aclose()

    asyncio.run(main())
