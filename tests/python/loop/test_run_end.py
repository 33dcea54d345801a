"""How ``loop.run()`` learns that its turn ended: from the inbox's claims and the loop going idle,
not by following the log, so its bookkeeping does not grow with the turn's events; and it still
returns at its own turn's end while the loop goes on with later turns.

Synchronised through futures handed to the model, never through sleeps.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Dict, List

import kerman
from kerman import AgentLoop, ModelReply


def _calls_into_run_module(fn: Any) -> int:
    """How many Python functions of ``kerman/_run.py`` run while ``fn()`` (a coroutine) runs,
    not counting the result's sum of usage (one call per assistant message it reads)."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        code = frame.f_code
        if event == "call" and code.co_filename.endswith("_run.py") and code.co_name != "_add_usage":
            count += 1

    async def main() -> None:
        sys.setprofile(profile)
        try:
            await fn()
        finally:
            sys.setprofile(None)

    asyncio.run(main())
    return count


def test_a_runs_bookkeeping_does_not_grow_with_its_turns_events() -> None:
    def run_with(tool_steps: int) -> int:
        async def model(request: kerman.ModelRequest) -> ModelReply:
            if request.step <= tool_steps:
                return ModelReply([{"type": "tool-call", "id": f"c{request.step}", "name": "noop", "arguments": "{}"}])
            return ModelReply("done")

        async def noop(args: Dict[str, Any], ctx: Any) -> str:
            return "ok"

        async def go() -> None:
            loop = AgentLoop(model, tools=[kerman.Tool("noop", noop)])
            result = await loop.run("go")
            assert result.text == "done" and result.turn == 1
            await loop.aclose()

        return _calls_into_run_module(go)

    short, long = run_with(0), run_with(20)
    # The long turn logs ~80 more events; what the run does for them is nothing.
    assert long == short, (short, long)


def test_a_run_returns_at_its_turns_end_while_a_later_turn_runs() -> None:
    async def main() -> None:
        second_started = asyncio.Event()
        release: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def model(request: kerman.ModelRequest) -> ModelReply:
            if request.turn == 2:
                second_started.set()
                await release
            return ModelReply(f"turn {request.turn}")

        loop = AgentLoop(model)
        entered: List[str] = []

        @loop.pre_step
        async def queue_more(step: kerman.PreStep, next: Any) -> Any:
            entered.extend(m.text for m in step.messages)
            if step.turn == 1:
                loop.followup("someone else's")  # the next turn, nobody's run
            return await next()

        result = await loop.run("mine")
        # Returned at turn 1's end: turn 2 is still in its model call.
        assert (result.turn, result.text, result.ending) == (1, "turn 1", {"kind": "completed"})
        await second_started.wait()
        assert loop.status == "running" and loop.turn == 2
        release.set_result(None)
        await loop.when_idle()
        assert entered == ["mine", "someone else's"]
        await loop.aclose()

    asyncio.run(main())
