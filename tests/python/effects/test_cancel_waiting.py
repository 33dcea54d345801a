"""Cancelling a turn that waits for a person about a call that started
(docs/durability.md, "on_in_doubt="ask""): a request of kind ``in-doubt`` (the process died in
the body of an ``ask`` tool) or ``input`` (the body returned ``InputRequired``) is resolved
``cancelled``, the call gets its one result (``TOOL_OUTCOME_UNKNOWN`` for a call in doubt: it
may have run; an interruption for one that needs input) and the turn ends cancelled, as a
cancel ends one waiting for an approval: the model is not asked again, and a loop that continues
crashed turns has nothing to continue. ``loop.resolve`` of the call in doubt while the turn
waits answers the request and leaves the loop idle; while a step runs it is refused."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from ask_child import build
from test_ask_in_doubt import events, executions, killed_mid_call, text_of

from kerman import AgentLoop, FileStore, InputRequired, ModelReply, Tool

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


def decisions_and_results(all_events: List[Any]) -> Dict[str, Any]:
    return {
        "resolved": [e.data["outcome"] for e in all_events if e.type == "decision/resolved"],
        "results": [e.data for e in all_events if e.type == "tool/result"],
        "ends": [e.data["reason"] for e in all_events if e.type == "turn/end"],
    }


@pytest.mark.parametrize("resume", ["close", "continue"])
def test_cancelling_a_turn_waiting_on_a_call_in_doubt_ends_it_cancelled(tmp_path: Path, resume: str) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "ask_write")
    asked: List[int] = []

    async def model(request: Any) -> Any:
        asked.append(request.step)
        return ModelReply("answered")

    async def main() -> None:
        with FileStore(root).open("s") as log:
            loop = build(model, log, str(counter))
            loop._core.continue_crashes = 3 if resume == "continue" else 0
            assert loop.status == "waiting" and [d.kind for d in loop.decisions] == ["in-doubt"]
            loop.cancel()
            await loop.when_idle()
            assert loop.status == "idle" and loop.decisions == []
            assert loop.wake() is False  # nothing to continue: the turn ended cancelled
            await loop.when_idle()
            await loop.aclose()

    asyncio.run(main())
    seen = decisions_and_results(events(root))
    assert seen["resolved"] == ["cancelled"]
    [result] = seen["results"]
    assert result["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert "may or may not have happened" in text_of(result)
    assert seen["ends"] == [{"kind": "aborted", "reason": {"kind": "user"}}]
    assert asked == []  # the model was not asked again
    assert [r["tool"] for r in executions(counter)] == ["ask_write"]


def test_cancelling_a_turn_waiting_for_a_tool_s_input_ends_it_cancelled() -> None:
    asked: List[int] = []
    runs: List[Any] = []

    async def model(request: Any) -> Any:
        asked.append(request.step)
        return ModelReply([{"type": "tool-call", "id": "c1", "name": "transfer", "arguments": "{}"}])

    async def transfer(args: Any, ctx: Any) -> Any:
        runs.append(ctx.input)
        return InputRequired("Transfer 5?", None, {"token": "t1"})

    async def main() -> List[Any]:
        loop = AgentLoop(model)
        loop.tool(Tool("transfer", transfer))
        loop.followup("go")
        await loop.when_idle()
        assert loop.status == "waiting" and [d.kind for d in loop.decisions] == ["input"]
        loop.cancel()
        await loop.when_idle()
        assert loop.status == "idle" and loop.decisions == []
        out = list(loop.log.events())
        await loop.aclose()
        return out

    seen = decisions_and_results(asyncio.run(main()))
    assert seen["resolved"] == ["cancelled"]
    [result] = seen["results"]
    assert result["error"]["code"] == "ABORTED_DURING_DISPATCH" and result["message"]["content"][0]["isError"] is True
    assert seen["ends"] == [{"kind": "aborted", "reason": {"kind": "user"}}]
    assert asked == [1] and runs == [None]  # neither the model nor the body ran again


def test_resolving_the_call_a_turn_waits_on_answers_the_request(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "ask_write")
    asked: List[List[str]] = []

    async def model(request: Any) -> Any:
        asked.append([m.role for m in request.messages])
        return ModelReply("answered")

    async def main() -> None:
        with FileStore(root).open("s") as log:
            loop = build(model, log, str(counter))
            loop._core.continue_crashes = 3  # as a Worker's loop
            assert loop.status == "waiting"
            loop.resolve("c1", "paid by hand")
            assert loop.decisions == [] and loop.status in ("idle", "running")
            await loop.when_idle()
            assert loop.status == "idle"
            await loop.aclose()

    asyncio.run(main())
    all_events = events(root)
    seen = decisions_and_results(all_events)
    assert seen["resolved"] == []  # answered by the call's result
    assert [text_of(r) for r in seen["results"]] == ["paid by hand"]
    assert [e["kind"] for e in seen["ends"]] == ["interrupted", "completed"]
    assert asked == [["user", "assistant", "user"]]  # the continuation answered the input
    assert [r["tool"] for r in executions(counter)] == ["ask_write"]


def test_resolve_is_refused_while_a_step_runs() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def model(request: Any) -> Any:
        if len(request.messages) > 1:
            return ModelReply("done")
        return ModelReply([{"type": "tool-call", "id": "c1", "name": "slow", "arguments": "{}"}])

    async def slow(args: Any, ctx: Any) -> str:
        started.set()
        await release.wait()
        return "slow ran"

    async def main() -> None:
        loop = AgentLoop(model)
        loop.tool(Tool("slow", slow))
        loop.followup("go")
        await started.wait()
        # Its tool/call is logged and its result is not: it is running, not in doubt.
        with pytest.raises(ValueError, match="'c1' is not in doubt now"):
            loop.resolve("c1", "by hand")
        release.set()
        await loop.when_idle()
        results = [e.data for e in loop.log.events() if e.type == "tool/result"]
        assert [text_of(r) for r in results] == ["slow ran"]
        await loop.aclose()

    asyncio.run(main())
