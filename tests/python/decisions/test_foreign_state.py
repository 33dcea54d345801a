"""An ``AgentLoop`` over a session that holds another framework's state: a pending request of
another framework (``decision/requested`` with a ``for``: pydantic-ai's deferred approvals under
``KermanDurability``), an unfinished run of it (``pydantic-ai/run`` without its ``run-end``), or
any plugin event. None of it is the loop's: ``run()``, ``when_idle()`` and ``run_sync()``
return as on any session, the loop is ``idle`` between turns, and the requests stay pending
(listed by ``loop.decisions``) for the framework that asked. The loop's own requests still hold
its turn until decided.

``asyncio.wait_for`` only turns a hang into a failure here; nothing waits on time.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Awaitable, TypeVar

import kerman
from kerman import AgentLoop, Approve, ModelReply
from kerman._core import cancel_foreign_decisions, request_foreign_decisions

T = TypeVar("T")
# Far more than a turn of the echo model takes: reached only by a hang.
BOUND = 30.0
PYDANTIC_RUN = {"kind": "pydantic-ai", "run": 1}


async def bounded(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, BOUND)


async def echo(request: kerman.ModelRequest) -> ModelReply:
    return ModelReply("echo: " + " / ".join(m.text for m in request.entered))


def ask_foreign(log: kerman.SessionLog, call_id: str = "r7") -> str:
    """Logs one pending request of another framework, as pydantic-ai's paused run does; its id."""
    (request,) = request_foreign_decisions(log, PYDANTIC_RUN, [(call_id, "refund", '{"order": 7}', None)])
    return str(request["decision_id"])


def foreign_ids(loop: AgentLoop) -> list[str]:
    return [d.call_id for d in loop.decisions]


def test_run_over_a_session_with_another_framework_s_pending_request_returns() -> None:
    async def main() -> None:
        store = kerman.MemoryStore()
        log = store.create("s")
        ask_foreign(log)
        loop = AgentLoop(echo, log)
        assert loop.status == "idle"
        result = await bounded(loop.run("hello"))
        assert result.text == "echo: hello"
        assert loop.status == "idle"
        # Still the framework's to decide: listed, not cancelled, not resolved by the turn.
        assert foreign_ids(loop) == ["r7"]
        second = await bounded(loop.run("again"))
        assert second.turn == 2
        await loop.aclose()

    asyncio.run(main())


def test_a_request_of_another_framework_logged_between_turns_does_not_hold_the_next() -> None:
    async def main() -> None:
        loop = AgentLoop(echo)
        await bounded(loop.run("one"))
        ask_foreign(loop.log)  # a pydantic-ai run in this process paused in the same session
        assert loop.status == "idle"
        result = await bounded(loop.run("two"))
        assert result.text == "echo: two" and loop.status == "idle"
        assert foreign_ids(loop) == ["r7"]
        await loop.aclose()

    asyncio.run(main())


def test_followup_and_when_idle_return() -> None:
    async def main() -> None:
        log = kerman.MemoryStore().create("s")
        ask_foreign(log)
        loop = AgentLoop(echo, log)
        loop.followup("hi")
        await bounded(loop.when_idle())
        assert loop.status == "idle" and loop.turn == 1
        assert loop.log.transcript()[-1].text == "echo: hi"
        await loop.aclose()

    asyncio.run(main())


def test_run_sync_returns() -> None:
    log = kerman.MemoryStore().create("s")
    ask_foreign(log)
    loop = AgentLoop(echo, log)
    answers: list[str] = []
    # In a thread of its own only so that a hang fails the test (the join's bound) instead of
    # blocking the test process.
    script = threading.Thread(target=lambda: answers.append(loop.run_sync("hi").text), daemon=True)
    script.start()
    script.join(BOUND)
    assert answers == ["echo: hi"]
    assert loop.status == "idle" and foreign_ids(loop) == ["r7"]


def test_a_followup_that_rejects_when_busy_is_not_refused_for_another_framework_s_request() -> None:
    async def main() -> None:
        log = kerman.MemoryStore().create("s")
        ask_foreign(log)
        loop = AgentLoop(echo, log, on_busy="reject")
        loop.followup("hi")
        await bounded(loop.when_idle())
        assert loop.log.transcript()[-1].text == "echo: hi"
        await loop.aclose()

    asyncio.run(main())


def test_an_unfinished_run_of_another_framework_and_plugin_events_do_not_hold_the_loop() -> None:
    async def main() -> None:
        log = kerman.MemoryStore().create("s")
        log.append("pydantic-ai/run", {"run": 1, "agent": "refunds", "prompt": "Refund order 7."})
        log.append("pydantic-ai/unit", {"unit": "model_request", "n": 0, "run": 1, "result": {}})
        log.append("pydantic-ai/started", {"unit": "refund", "n": 0, "run": 1})
        log.append("acme/anything", {"x": 1})
        loop = AgentLoop(echo, log)
        assert loop.status == "idle" and loop.decisions == []
        assert (await bounded(loop.run("hi"))).text == "echo: hi"
        await loop.aclose()

    asyncio.run(main())


def test_the_loop_s_own_request_still_holds_its_turn_beside_another_framework_s() -> None:
    """The loop's own request makes it wait (``run()`` waits with it) until decided; the other
    framework's request stays pending through the loop's decision and the turn's end."""
    calls: list[str] = []

    async def model(request: kerman.ModelRequest) -> ModelReply:
        if request.step == 1:
            return ModelReply([{"type": "tool-call", "id": "c1", "name": "wire", "arguments": '{"amount": 5}'}])
        return ModelReply("sent")

    async def main() -> None:
        log = kerman.MemoryStore().create("s")
        ask_foreign(log)
        loop = AgentLoop(model, log)

        @loop.tool(needs_approval=True)
        def wire(amount: int) -> str:
            calls.append(f"wire {amount}")
            return "ok"

        run = asyncio.ensure_future(loop.run("pay"))
        waited = asyncio.get_running_loop().create_future()
        loop.on("agent/status", lambda event: event.status == "waiting" and not waited.done() and waited.set_result(None))
        await bounded(waited)
        assert loop.status == "waiting" and not run.done()
        mine = [d for d in loop.decisions if d.call_id == "c1"]
        assert len(mine) == 1 and sorted(foreign_ids(loop)) == ["c1", "r7"]
        # Each entry says whose it is: the other framework's names its requester.
        assert {d.call_id: d.requester for d in loop.decisions} == {"c1": None, "r7": PYDANTIC_RUN}
        (theirs,) = [d for d in loop.decisions if d.requester is not None]
        assert repr(theirs).endswith(' for={"kind":"pydantic-ai","run":1}>')
        assert {d.call_id: d.requester for d in kerman.decisions.pending(log)} == {"c1": None, "r7": PYDANTIC_RUN}
        assert loop.decide(mine[0].decision_id, Approve())
        result = await bounded(run)
        assert result.text == "sent" and calls == ["wire 5"]
        assert loop.status == "idle" and foreign_ids(loop) == ["r7"]
        await loop.aclose()

    asyncio.run(main())


def test_the_loop_s_own_request_left_waiting_is_found_on_reopen_beside_another_framework_s() -> None:
    async def model(request: kerman.ModelRequest) -> ModelReply:
        if request.step == 1:
            return ModelReply([{"type": "tool-call", "id": "c1", "name": "wire", "arguments": "{}"}])
        return ModelReply("sent")

    def wire() -> str:
        return "ok"

    async def first(log: kerman.SessionLog) -> None:
        loop = AgentLoop(model, log, tools=[kerman.Tool("wire", wire, needs_approval=True)])
        loop.followup("pay")
        await bounded(loop.when_idle())
        assert loop.status == "waiting"
        await loop.aclose()

    async def second(log: kerman.SessionLog) -> None:
        loop = AgentLoop(model, log, tools=[kerman.Tool("wire", wire, needs_approval=True)])
        assert loop.status == "waiting"
        (mine,) = [d for d in loop.decisions if d.call_id == "c1"]
        loop.decide(mine.decision_id, Approve())
        await bounded(loop.when_idle())
        assert loop.status == "idle" and loop.log.transcript()[-1].text == "sent"
        assert foreign_ids(loop) == ["r7"]
        await loop.aclose()

    store = kerman.MemoryStore()
    log = store.create("s")
    ask_foreign(log)
    asyncio.run(first(log))
    asyncio.run(second(log))


def test_cancel_leaves_another_framework_s_request_and_the_loop_idle() -> None:
    async def main() -> None:
        log = kerman.MemoryStore().create("s")
        ask_foreign(log)
        loop = AgentLoop(echo, log)
        loop.cancel()
        assert loop.status == "idle" and foreign_ids(loop) == ["r7"]
        assert (await bounded(loop.run("hi"))).text == "echo: hi"
        assert cancel_foreign_decisions(log, PYDANTIC_RUN) == 1
        assert loop.decisions == []
        await loop.aclose()

    asyncio.run(main())
