"""``loop.run()`` / ``run_sync()``: one call per prompt, answered by the turn that took it.

Every test drives its own event loop with ``asyncio.run`` and synchronises through futures and
events handed to the scripted model, never through sleeps.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import pytest

import kerman
from kerman import AgentLoop, LoopError, ModelError, ModelReply, Reject, RunError, RunResult


async def echo(request: kerman.ModelRequest) -> ModelReply:
    return ModelReply("echo: " + " / ".join(m.text for m in request.entered), usage={"input": 3, "output": 2})


class Gate:
    """A model that answers each request with the entered text once its gate opens: the test
    decides when a turn's model call returns."""

    def __init__(self) -> None:
        self.started: asyncio.Queue[kerman.ModelRequest] = asyncio.Queue()
        self.release: Dict[int, asyncio.Future[None]] = {}

    def gate(self, turn: int) -> asyncio.Future[None]:
        return self.release.setdefault(turn, asyncio.get_running_loop().create_future())

    async def __call__(self, request: kerman.ModelRequest) -> ModelReply:
        await self.started.put(request)
        await self.gate(request.turn)
        return ModelReply(f"turn {request.turn}: " + " + ".join(m.text for m in request.messages if m.role == "user"))


def test_run_returns_its_turns_answer() -> None:
    async def main() -> None:
        loop = AgentLoop(echo)
        result = await loop.run("hello")
        assert isinstance(result, RunResult)
        assert result.text == "echo: hello" and result.output == "echo: hello"
        assert result.turn == 1 and result.ending == {"kind": "completed"}
        assert [m.role for m in result.messages] == ["user", "assistant"]
        assert (result.usage.prompt, result.usage.output, result.usage.requests) == (3, 2, 1)
        assert "turn=1 completed" in repr(result) and "echo: hello" in repr(result)
        second = await loop.run("again")
        assert second.turn == 2 and second.text == "echo: again" and [m.text for m in second.messages] == ["again", "echo: again"]
        await loop.aclose()

    asyncio.run(main())


def test_usage_is_the_ledgers_total_of_the_turn() -> None:
    calls: List[int] = []

    async def model(request: kerman.ModelRequest) -> ModelReply:
        calls.append(request.step)
        if request.step == 1:
            return ModelReply([{"type": "tool-call", "id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}'}], usage={"output": 5})
        return ModelReply("3", usage={"output": 1, "input": 7})

    async def main() -> None:
        loop = AgentLoop(model)

        @loop.tool
        def add(a: int, b: int) -> str:
            return str(a + b)

        result = await loop.run("1+2?")
        # The turn's totals from the usage ledger: both requests, the tool call between them.
        usage = result.usage
        assert result.text == "3" and (usage.output, usage.prompt, usage.requests, usage.tool_calls) == (6, 7, 2, 1)
        assert result.usage == kerman.usage.ledger(loop.log).turn(1)
        assert [type(m).__name__ for m in result.messages] == ["UserMessage", "AssistantMessage", "ToolResultMessage", "AssistantMessage"]
        await loop.aclose()

    asyncio.run(main())


def test_steering_from_another_task_enters_the_runs_turn() -> None:
    async def main() -> None:
        model = Gate()
        loop = AgentLoop(model)
        running = asyncio.ensure_future(loop.run("first"))
        await model.started.get()  # turn 1, step 1 is in the model
        loop.steer("also this")
        model.gate(1).set_result(None)
        result = await running
        # The steer entered the same turn at the next step: the run's answer is that step's.
        assert result.turn == 1 and result.text == "turn 1: first + also this"
        assert [m.text for m in result.messages if m.role == "user"] == ["first", "also this"]
        await loop.aclose()

    asyncio.run(main())


def test_concurrent_runs_each_get_their_own_turn() -> None:
    async def main() -> None:
        model = Gate()
        loop = AgentLoop(model)
        a = asyncio.ensure_future(loop.run("A"))
        await model.started.get()
        b = asyncio.ensure_future(loop.run("B"))
        await asyncio.sleep(0)  # let b send its prompt (it waits in next-turn behind turn 1)
        # A plain followup in between: its turn is nobody's run.
        loop.followup("C")
        model.gate(2).set_result(None)
        model.gate(3).set_result(None)
        model.gate(1).set_result(None)
        ra, rb = await asyncio.gather(a, b)
        assert (ra.turn, ra.text) == (1, "turn 1: A")
        assert (rb.turn, rb.text) == (2, "turn 2: A + B")
        await loop.when_idle()
        assert loop.turn == 3
        await loop.aclose()

    asyncio.run(main())


def test_a_failing_model_raises_run_error_with_the_failure() -> None:
    async def failing(request: kerman.ModelRequest) -> ModelReply:
        raise ModelError("the model is down", "UNAVAILABLE", status=503)

    async def main() -> None:
        loop = AgentLoop(failing, options={})
        loop.request_error(lambda failure, next: None)  # no retries
        with pytest.raises(RunError) as caught:
            await loop.run("hi")
        error = caught.value
        assert error.kind == "error" and error.code == "UNAVAILABLE" and error.turn == 1
        assert error.failure is not None and error.failure["message"] == "the model is down"
        assert "turn 1 failed: the model is down [UNAVAILABLE]" in str(error)
        assert error.result is not None and [m.text for m in error.result.messages] == ["hi"]
        await loop.aclose()

    asyncio.run(main())


def test_a_prompt_rejected_by_a_pre_step_decision_raises() -> None:
    async def main() -> None:
        loop = AgentLoop(echo)

        @loop.pre_step
        async def guard(step: kerman.PreStep, next: Any) -> Any:
            if any("rm -rf" in m.text for m in step.messages):
                return Reject("destructive")
            return await next()

        with pytest.raises(RunError) as caught:
            await loop.run("rm -rf /")
        assert caught.value.kind == "blocked" and caught.value.ending == {"kind": "blocked", "reason": "destructive"}
        assert "rejected by a pre-step decision: destructive" in str(caught.value)
        # A blocked turn leaves the loop idle; the next run goes on.
        assert (await loop.run("ls")).text == "echo: ls"
        await loop.aclose()

    asyncio.run(main())


def test_a_run_queued_behind_a_failed_turn_still_gets_its_turn() -> None:
    """After a blocked (or failed) turn the loop idles with input pending; a run waiting for its
    prompt wakes it instead of waiting forever."""

    async def main() -> None:
        model = Gate()
        loop = AgentLoop(model)

        @loop.pre_step
        async def guard(step: kerman.PreStep, next: Any) -> Any:
            return Reject("no") if any(m.text == "bad" for m in step.messages) else await next()

        bad = asyncio.ensure_future(loop.run("bad"))
        good = asyncio.ensure_future(loop.run("good"))
        with pytest.raises(RunError):
            await bad
        await model.started.get()
        model.gate(2).set_result(None)
        assert (await good).text == "turn 2: good"
        await loop.aclose()

    asyncio.run(main())


def test_loop_cancel_raises_aborted_and_discards_queued_runs() -> None:
    async def main() -> None:
        model = Gate()
        loop = AgentLoop(model)
        first = asyncio.ensure_future(loop.run("one"))
        await model.started.get()
        queued = asyncio.ensure_future(loop.run("two"))
        await asyncio.sleep(0)
        loop.cancel()
        with pytest.raises(RunError) as aborted:
            await first
        assert aborted.value.kind == "aborted" and aborted.value.ending["reason"] == {"kind": "user"}
        with pytest.raises(RunError) as discarded:
            await queued
        assert discarded.value.kind == "discarded" and discarded.value.turn is None
        await loop.aclose()

    asyncio.run(main())


def test_cancelling_the_awaiting_task_cancels_its_turn_only() -> None:
    async def main() -> None:
        model = Gate()
        loop = AgentLoop(model)
        mine = asyncio.ensure_future(loop.run("mine"))
        await model.started.get()
        other = asyncio.ensure_future(loop.run("other"))
        await asyncio.sleep(0)
        mine.cancel()
        with pytest.raises(asyncio.CancelledError):
            await mine
        await model.started.get()  # the other run's prompt was kept, and its turn runs
        model.gate(2).set_result(None)
        result = await other
        assert result.turn == 2
        ends = [e.data for e in loop.log.events() if e.type == "turn/end"]
        assert ends[0] == {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "user"}}}
        await loop.aclose()

    asyncio.run(main())


def test_cancelling_a_run_before_its_turn_withdraws_the_prompt() -> None:
    async def main() -> None:
        model = Gate()
        loop = AgentLoop(model)
        first = asyncio.ensure_future(loop.run("first"))
        await model.started.get()
        waiting = asyncio.ensure_future(loop.run("never"))
        await asyncio.sleep(0)
        assert [m.text for m in loop.inbox.next_turn] == ["never"]
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert len(loop.inbox) == 0
        model.gate(1).set_result(None)
        assert (await first).turn == 1
        await loop.when_idle()
        assert loop.turn == 1  # no turn for the withdrawn prompt
        await loop.aclose()

    asyncio.run(main())


def test_run_sync_blocks_in_a_script_and_refuses_inside_an_event_loop() -> None:
    loop = AgentLoop(echo)
    result = loop.run_sync("one")
    assert result.text == "echo: one"
    assert loop.run_sync("two").turn == 2  # the same private event loop again

    async def inside() -> None:
        with pytest.raises(LoopError, match=r"await loop\.run\(\.\.\.\)"):
            loop.run_sync("three")

    asyncio.run(inside())
    assert loop.turn == 2


def test_run_checks_its_prompt() -> None:
    async def main() -> None:
        loop = AgentLoop(echo)
        with pytest.raises(TypeError, match="prompt must be a str or a UserMessage, got int"):
            await loop.run(42)  # type: ignore[arg-type]
        await loop.aclose()

    asyncio.run(main())
