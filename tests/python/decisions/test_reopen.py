"""A loop closed while a call waits, its session reopened by a new AgentLoop over each store
(memory, file, PostgreSQL): the request is listed again, the new loop starts ``waiting``, and a
decision runs the call once with the decided arguments, without asking the model again."""

from __future__ import annotations

import asyncio
from typing import Any, List

from kerman import AgentLoop, Edit, ModelReply


def test_a_pending_decision_survives_reopening_the_session(store: Any) -> None:
    ran: List[int] = []
    requests: List[int] = []

    def build(log: Any) -> AgentLoop:
        async def model(request: Any) -> Any:
            requests.append(request.step)
            if not requests[:-1]:
                return ModelReply([{"type": "tool-call", "id": "c1", "name": "pay", "arguments": '{"amount": 5}'}])
            return ModelReply("done")

        loop = AgentLoop(model, log=log)

        @loop.tool(needs_approval=True)
        async def pay(amount: int) -> str:
            """Pays."""
            ran.append(amount)
            return "paid"

        return loop

    async def first() -> str:
        log = store.create()
        loop = build(log)
        loop.followup("pay")
        await loop.when_idle()
        decision_id = loop.decisions[0].decision_id
        await loop.aclose()
        log.close()
        return log.id, decision_id

    async def second(sid: str, decision_id: str) -> None:
        log = store.open(sid)
        try:
            loop = build(log)
            assert loop.status == "waiting"
            assert [d.decision_id for d in loop.decisions] == [decision_id]
            assert not [e for e in log.events() if e.type == "turn/end"]
            loop.decide(decision_id, Edit({"amount": 4}), key="k")
            await loop.when_idle()
            assert [e.data["reason"]["kind"] for e in log.events() if e.type == "turn/end"] == ["completed"]
            await loop.aclose()
        finally:
            log.close()

    sid, decision_id = asyncio.run(first())
    assert ran == [] and requests == [1]
    asyncio.run(second(sid, decision_id))
    assert ran == [4]
    assert requests == [1, 2]  # one more request: the step after the result


class _PaySession:
    """A file-store session whose first turn asks to run ``pay(amount=5)`` and was closed while
    waiting; ``reopen()`` builds a loop over it. ``ran`` holds each amount paid, ``requests``
    counts the model requests of every loop."""

    def __init__(self, tmp_path: Any) -> None:
        import kerman

        self.store = kerman.FileStore(tmp_path / "s", durability="none")
        self.ran: List[int] = []
        self.requests: List[int] = []

        async def first() -> None:
            with self.store.create("s") as log:
                call = {"type": "tool-call", "id": "c1", "name": "pay", "arguments": '{"amount": 5}'}
                loop = self.build(log, ModelReply([call]))
                loop.followup("pay")
                await loop.when_idle()
                await loop.aclose()

        asyncio.run(first())

    def build(self, log: Any, *replies: ModelReply) -> AgentLoop:
        replies_left = list(replies)

        async def model(request: Any) -> Any:
            self.requests.append(1)
            return replies_left.pop(0)

        loop = AgentLoop(model, log=log)

        @loop.tool(needs_approval=True)
        async def pay(amount: int) -> str:
            """Pays."""
            self.ran.append(amount)
            return "paid"

        return loop


def test_decided_outside_async_code_the_step_resumes_at_the_next_wake(tmp_path: Any) -> None:
    """A script that reopens a waiting session and decides before any event loop runs: the
    decision is logged at once, and the step goes on at the next ``wake()``."""
    import kerman

    session = _PaySession(tmp_path)
    with session.store.open("s") as log:
        loop = session.build(log, ModelReply("done"))
        [pending] = loop.decisions
        assert loop.decide(pending.decision_id, kerman.Approve()) is True
        assert loop.status == "idle" and loop.decisions == []
        assert session.ran == []

        async def resume() -> None:
            assert loop.wake() is True
            await loop.when_idle()

        asyncio.run(resume())
        assert session.ran == [5]


def test_cancelled_outside_async_code_the_turn_ends_aborted_at_the_next_wake(tmp_path: Any) -> None:
    """A script that reopens a waiting session and cancels it before any event loop runs: the
    requests are logged ``cancelled`` at once, and at the next ``wake()`` the turn ends as a
    cancel ends it (aborted, every call aborted before dispatch) without asking the model again."""
    session = _PaySession(tmp_path)
    with session.store.open("s") as log:
        loop = session.build(log, ModelReply("never asked"))
        assert loop.status == "waiting"
        loop.cancel()
        assert loop.status == "idle"

        async def resume() -> None:
            assert loop.wake() is True
            await loop.when_idle()

        asyncio.run(resume())
        assert session.ran == [] and session.requests == [1]
        kinds = {e.type: e.data for e in log.events()}
        assert kinds["decision/resolved"]["outcome"] == "cancelled"
        assert kinds["turn/end"]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}, kinds["turn/end"]
        assert loop.status == "idle" and loop.decisions == []
