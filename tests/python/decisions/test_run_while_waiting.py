"""Issue 27 item 2: the calls of a step that need no decision run while the step waits for the
others' decisions (docs/decisions.md, "Waiting"). Each result is committed as soon as it is
known, the decided call runs once the step's decisions are in, and the model sees the step's
results in call order."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Dict, List

import kerman
from kerman import AgentLoop, Approve, FileStore, ModelReply
from kerman.models import ScriptedModel


def calls(*items: Any) -> ModelReply:
    return ModelReply([{"type": "tool-call", "id": i, "name": n, "arguments": json.dumps(a)} for i, n, a in items])


def kinds(loop: AgentLoop) -> List[str]:
    return [e.type for e in loop.log.events()]


def result_ids(messages: List[Any]) -> List[str]:
    """The call ids of the tool results among ``messages``, in order."""
    return [m.source["callId"] for m in messages if m.source.get("kind") == "tool"]


def test_a_call_that_needs_no_decision_runs_and_commits_before_the_asked_one_is_decided() -> None:
    async def main() -> None:
        ran: List[str] = []
        requests: List[kerman.ModelRequest] = []

        async def model(request: kerman.ModelRequest) -> Any:
            requests.append(request)
            if len(requests) == 1:
                return calls(("c1", "pay", {"amount": 5}), ("c2", "read", {}))
            return ModelReply("paid")

        loop = AgentLoop(model)

        @loop.tool(needs_approval=True)
        async def pay(amount: int) -> str:
            """Pays."""
            ran.append("pay")
            return f"paid {amount}"

        @loop.tool
        async def read() -> str:
            """Reads."""
            ran.append("read")
            return "balance 10"

        loop.followup("pay bob")
        await loop.when_idle()
        assert loop.status == "waiting"
        # Call 2 ran, and its result is in the log, before call 1 is decided.
        assert ran == ["read"]
        [pending] = loop.decisions
        assert pending.call_id == "c1"
        types = kinds(loop)
        assert types.index("decision/requested") < types.index("tool/call") < types.index("tool/result")
        assert "decision/resolved" not in types
        [result] = [e.data for e in loop.log.events() if e.type == "tool/result"]
        assert result["message"]["source"]["callId"] == "c2"
        assert len(requests) == 1

        loop.decide(pending.decision_id, Approve(), by="ann")
        await loop.when_idle()
        assert ran == ["read", "pay"]
        assert loop.status == "idle"
        # The log has the results in the order they were known; the model sees them in call order.
        logged = [e.data["message"]["source"]["callId"] for e in loop.log.events() if e.type == "tool/result"]
        assert logged == ["c2", "c1"]
        assert len(requests) == 2
        assert result_ids(requests[1].messages) == ["c1", "c2"]
        assert [e.data["reason"]["kind"] for e in loop.log.events() if e.type == "turn/end"] == ["completed"]

    asyncio.run(main())


def test_a_decision_made_while_the_other_call_runs_applies_once_it_is_done() -> None:
    async def main() -> None:
        ran: List[str] = []
        release = asyncio.Event()
        started = asyncio.Event()
        loop = AgentLoop(ScriptedModel([calls(("c1", "pay", {}), ("c2", "slow", {})), "done"]))

        @loop.tool(needs_approval=True)
        async def pay() -> str:
            """Pays."""
            ran.append("pay")
            return "paid"

        @loop.tool
        async def slow() -> str:
            """Runs until released."""
            started.set()
            await release.wait()
            ran.append("slow")
            return "slow done"

        loop.followup("go")
        await started.wait()
        # The step runs a call: it is not idle yet, and the question is listed already.
        assert loop.status == "running"
        [pending] = loop.decisions
        loop.decide(pending.decision_id, Approve())
        assert ran == []
        release.set()
        await loop.when_idle()
        assert ran == ["slow", "pay"]
        assert loop.status == "idle"
        assert [e.data["reason"]["kind"] for e in loop.log.events() if e.type == "turn/end"] == ["completed"]

    asyncio.run(main())


def test_cancel_while_a_call_runs_and_another_waits_cancels_both() -> None:
    async def main() -> None:
        started = asyncio.Event()
        loop = AgentLoop(ScriptedModel([calls(("c1", "pay", {}), ("c2", "slow", {})), "done"]))

        @loop.tool(needs_approval=True)
        async def pay() -> str:
            """Pays."""
            raise AssertionError("a cancelled request's call never runs")

        @loop.tool
        async def slow() -> str:
            """Runs until cancelled."""
            started.set()
            await asyncio.Event().wait()
            return "never"

        loop.followup("go")
        await started.wait()
        loop.cancel()
        await loop.when_idle()
        assert loop.status == "idle" and loop.decisions == []
        [resolved] = [e.data for e in loop.log.events() if e.type == "decision/resolved"]
        assert resolved["outcome"] == "cancelled"
        codes = {e.data["message"]["source"]["callId"]: e.data["error"]["code"] for e in loop.log.events() if e.type == "tool/result"}
        assert codes == {"c2": "ABORTED_DURING_DISPATCH", "c1": "ABORTED_BEFORE_DISPATCH"}
        assert [e.data["reason"]["kind"] for e in loop.log.events() if e.type == "turn/end"] == ["aborted"]

    asyncio.run(main())


def test_a_reopened_session_keeps_what_ran_and_runs_only_the_decided_call(tmp_path: Path) -> None:
    ran: List[Dict[str, Any]] = []

    def tools() -> List[kerman.Tool]:
        async def body(args: Dict[str, Any], ctx: kerman.ToolContext) -> str:
            ran.append(args)
            return "ok"

        return [kerman.Tool("pay", body, needs_approval=True), kerman.Tool("read", body)]

    async def first() -> None:
        store = FileStore(tmp_path)
        log = store.create("s")
        loop = AgentLoop(ScriptedModel([calls(("c1", "pay", {"n": 1}), ("c2", "read", {"n": 2}))]), log=log, tools=tools())
        loop.followup("go")
        await loop.when_idle()
        assert loop.status == "waiting" and ran == [{"n": 2}]
        await loop.aclose()
        log.close()

    async def second() -> None:
        store = FileStore(tmp_path)
        requests: List[kerman.ModelRequest] = []

        async def model(request: kerman.ModelRequest) -> Any:
            requests.append(request)
            return ModelReply("done")

        log = store.open("s")
        loop = AgentLoop(model, log=log, tools=tools())
        assert loop.status == "waiting"
        [pending] = loop.decisions
        loop.decide(pending.decision_id, Approve())
        await loop.when_idle()
        assert ran == [{"n": 2}, {"n": 1}]  # the read ran once, before the close
        assert result_ids(requests[0].messages) == ["c1", "c2"]
        await loop.aclose()
        log.close()

    asyncio.run(first())
    asyncio.run(second())


def test_the_agui_run_ends_with_the_interrupt_once_the_other_calls_ran() -> None:
    import kerman.ui

    async def main() -> None:
        loop = AgentLoop(ScriptedModel([calls(("c1", "pay", {}), ("c2", "read", {})), "done"]))

        @loop.tool(needs_approval=True)
        async def pay() -> str:
            """Pays."""
            return "paid"

        @loop.tool
        async def read() -> str:
            """Reads."""
            return "read"

        loop.followup("go")
        await loop.when_idle()
        waiting = [u.data for u in kerman.ui.agui(loop.log.events(), thread_id="t")]
        shown = [(d["type"], d.get("toolCallId")) for d in waiting if d["type"] in ("TOOL_CALL_RESULT", "RUN_FINISHED")]
        # The read's result is in the run; the run then ends with the interrupt for the pay.
        assert shown == [("TOOL_CALL_RESULT", "c2"), ("RUN_FINISHED", None)]
        assert [i["toolCallId"] for i in waiting[-1]["outcome"]["interrupts"]] == ["c1"]
        loop.decide(loop.decisions[0].decision_id, Approve())
        await loop.when_idle()
        events = [u.data for u in kerman.ui.agui(loop.log.events(), thread_id="t")]
        runs = [(d["type"], d.get("runId")) for d in events if d["type"] in ("RUN_STARTED", "RUN_FINISHED")]
        assert runs == [("RUN_STARTED", "turn-1"), ("RUN_FINISHED", "turn-1"), ("RUN_STARTED", "turn-1.1"), ("RUN_FINISHED", "turn-1.1")]
        # Every tool event is inside a run.
        inside = False
        for d in events:
            if d["type"] == "RUN_STARTED":
                inside = True
            elif d["type"] == "RUN_FINISHED":
                inside = False
            elif d["type"].startswith("TOOL_CALL"):
                assert inside, d

    asyncio.run(main())
