"""A step that waits keeps the verdicts its gate gave the step's other calls (docs/decisions.md,
"Waiting"): they are logged with the round's requests, so a new loop that takes the step up
after a reopen runs exactly what was gated before the wait, edit included, and never runs its
own gate for those calls, however differently that gate would answer now. Also: a decision that
lands while the run that asked is still ending is not lost."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Dict, List

import kerman
import kerman.ui
from kerman import AgentLoop, Approve, Deny, Edit, ModelReply, ToolCall
from kerman.cli._timeline import summarize


def calls(*items: Any) -> ModelReply:
    return ModelReply([{"type": "tool-call", "id": i, "name": n, "arguments": json.dumps(a)} for i, n, a in items])


def test_a_reopened_step_runs_what_the_first_gate_decided_and_never_gates_it_again(tmp_path: Path) -> None:
    store = kerman.FileStore(str(tmp_path))
    ran: List[Dict[str, Any]] = []
    model_calls: List[int] = []

    def build(log: Any, gate: Any) -> AgentLoop:
        async def model(request: Any) -> Any:
            model_calls.append(request.step)
            if request.step == 1:
                return calls(("c1", "read", {"n": 1}), ("c2", "pay", {"amount": 9}), ("c3", "read", {"n": 3}), ("c4", "read", {"n": 4}))
            return ModelReply("done")

        loop = AgentLoop(model, log=log)

        @loop.tool
        async def read(n: int) -> str:
            """Reads."""
            ran.append({"read": n})
            return "read"

        @loop.tool(needs_approval=True)
        async def pay(amount: int) -> str:
            """Pays."""
            ran.append({"pay": amount})
            return "paid"

        loop.before_tool(gate)
        return loop

    async def first_gate(call: ToolCall, next: Any) -> Any:
        # c1 runs, c3 runs edited, c4 is denied; pay asks (next()).
        if call.call_id == "c3":
            return Edit({"n": 30})
        if call.call_id == "c4":
            return Deny("not now")
        return await next()

    second_gated: List[str] = []

    async def second_gate(call: ToolCall, next: Any) -> Any:
        # A gate that would answer otherwise today: it denies everything it sees.
        second_gated.append(call.call_id)
        return Deny("changed my mind")

    async def first() -> tuple[str, str]:
        log = store.create()
        loop = build(log, first_gate)
        loop.followup("go")
        await loop.when_idle()
        assert loop.status == "waiting"
        [request] = [e for e in log.events() if e.type == "decision/requested"]
        assert [(g["index"], g["callId"], g["verdict"]) for g in request.data["gated"]] == [
            (0, "c1", "run"),
            (2, "c3", "edit"),
            (3, "c4", "deny"),
        ]
        view = kerman.events.view(request)
        assert [g["verdict"] for g in view.gated] == ["run", "edit", "deny"]
        assert summarize(request).endswith("; gated #c1 run, #c3 edit, #c4 deny"), summarize(request)
        # The UI streams show the request, not the verdicts kept for the resume.
        shown = [u.data for u in kerman.ui.agui(log.events(), thread_id="t")] + [u.data for u in kerman.ui.vercel(log.events())]
        assert any("decision" in json.dumps(d) for d in shown)
        assert "gated" not in json.dumps(shown)
        decision_id = loop.decisions[0].decision_id
        await loop.aclose()
        log.close()
        return log.id, decision_id

    async def second(sid: str, decision_id: str) -> None:
        log = store.open(sid)
        try:
            loop = build(log, second_gate)
            assert loop.status == "waiting"
            loop.decide(decision_id, Approve())
            await loop.when_idle()
            await loop.aclose()
        finally:
            log.close()
        logged = {e.data["callId"]: json.loads(e.data["arguments"]) for e in log.events() if e.type == "tool/call"}
        assert (logged["c1"], logged["c2"], logged["c3"]) == ({"n": 1}, {"amount": 9}, {"n": 30})
        denied = [e.data for e in log.events() if e.type == "tool/result" and (e.data.get("error") or {}).get("code")]
        assert len(denied) == 1 and "not now" in json.dumps(denied[0])

    sid, decision_id = asyncio.run(first())
    assert ran == [{"read": 1}, {"read": 30}], "the calls that need no decision ran while the step waited"
    asyncio.run(second(sid, decision_id))
    assert second_gated == [], "the new loop's gate ran for calls the first gate had judged"
    assert ran == [{"read": 1}, {"read": 30}, {"pay": 9}]
    assert model_calls == [1, 2], "the model is not asked again for the held step"


def _waiting_loop(ran: List[int]) -> AgentLoop:
    loop = AgentLoop(kerman.models.ScriptedModel([calls(("c1", "pay", {"amount": 5})), "done"]))

    @loop.tool(needs_approval=True)
    async def pay(amount: int) -> str:
        """Pays."""
        ran.append(amount)
        return "paid"

    return loop


def test_a_decision_applied_before_the_asking_run_ended_resumes_the_step() -> None:
    """The requests are in the log (and visible to other processes) before the run that wrote
    them has ended: a decision from another thread can land while the loop is still "running",
    so ``loop.decide`` leaves the resume to the end of the run, which must take it up."""

    async def main() -> None:
        ran: List[int] = []
        loop = _waiting_loop(ran)
        finish = loop._finish_driver

        def decided_first() -> None:
            loop._finish_driver = finish  # type: ignore[method-assign]
            [request] = loop.decisions
            assert loop.status == "running"
            loop.decide(request.decision_id, Approve())
            finish()

        loop._finish_driver = decided_first  # type: ignore[method-assign]
        loop.followup("pay")
        await loop.when_idle()
        if loop.status == "running":  # the resumed step
            await loop.when_idle()
        assert loop.status == "idle"
        assert ran == [5]

    asyncio.run(main())


def test_a_decision_applied_while_the_run_ends_waiting_resumes_the_step() -> None:
    """The narrower window: the run read "still waiting" and a decision reads the status before
    the run sets it to "waiting"."""

    async def main() -> None:
        ran: List[int] = []
        loop = _waiting_loop(ran)
        set_status = loop._set_status

        def racing(status: str) -> None:
            if status == "waiting" and loop.decisions:
                loop.decide(loop.decisions[0].decision_id, Approve())
            set_status(status)

        loop._set_status = racing  # type: ignore[method-assign]
        loop.followup("pay")
        await loop.when_idle()
        if loop.status == "running":  # the resumed step
            await loop.when_idle()
        assert loop.status == "idle"
        assert ran == [5]

    asyncio.run(main())
