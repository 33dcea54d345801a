"""Where a user looks at decisions: the typed views (``kerman.events``), ``kerman log show``'s
timeline, the notebook repr of a waiting loop, the UI fold, and ``log.append`` refusing the
loop's own decision types."""

from __future__ import annotations

import asyncio
import json
from typing import Any, List

import pytest

import kerman
from kerman import AgentLoop, Ask, Deny, ModelReply
from kerman import events as ev
from kerman.cli._timeline import summarize
from kerman.models import ScriptedModel
from kerman.ui._fold import Sink, UiFold


async def waiting_then_denied() -> AgentLoop:
    model = ScriptedModel([ModelReply([{"type": "tool-call", "id": "c1", "name": "pay", "arguments": '{"amount": 5}'}]), "ok"])
    loop = AgentLoop(model)

    @loop.tool(needs_approval=True)
    async def pay(amount: int) -> str:
        """Pays."""
        return "paid"

    @loop.before_tool
    async def gate(call: kerman.ToolCall, next: Any) -> Any:
        return Ask(note="pay bob?") if call.name == "pay" else await next()

    loop.followup("go")
    await loop.when_idle()
    html = loop._repr_html_()
    assert "waiting for" in html and "pay bob?" in html and loop.decisions[0].decision_id in html
    loop.decide(loop.decisions[0].decision_id, Deny("no"), by="ann")
    await loop.when_idle()
    return loop


def test_views_timeline_and_fold() -> None:
    loop = asyncio.run(waiting_then_denied())
    requested = [v for v in ev.views(loop.log.events()) if isinstance(v, ev.DecisionRequested)]
    resolved = [v for v in ev.views(loop.log.events()) if isinstance(v, ev.DecisionResolved)]
    assert len(requested) == len(resolved) == 1
    r, s = requested[0], resolved[0]
    assert (r.turn, r.step, r.call_id, r.index, r.name, r.arguments, r.kind, r.note) == (
        1,
        1,
        "c1",
        0,
        "pay",
        '{"amount": 5}',
        "approval",
        "pay bob?",
    )
    assert r.digest.startswith("sha256:") and r.expires_at is None and r.schema is None and r.last is True
    assert (s.decision_id, s.outcome, s.by, s.reason, s.digest) == (r.decision_id, "denied", "ann", "no", None)
    assert ev.TYPES[ev.DECISION_REQUESTED] is ev.DecisionRequested
    assert ev.TYPES[ev.DECISION_RESOLVED] is ev.DecisionResolved

    lines = [summarize(e) for e in loop.log.events() if e.type.startswith("decision/")]
    assert lines[0].startswith("approval? pay(") and "#c1" in lines[0] and "pay bob?" in lines[0]
    assert lines[1].startswith("denied #c1") and "by ann" in lines[1]

    seen: List[str] = []

    class Recorder(Sink):
        def decision_requested(self, request: ev.DecisionRequested) -> None:
            seen.append(f"requested {request.call_id}")

        def decision_resolved(self, resolution: ev.DecisionResolved) -> None:
            seen.append(f"resolved {resolution.outcome}")

        def tool_answered(self, seq: int, call_id: str, message_id: str, text: str, is_error: bool, error: Any) -> None:
            seen.append(f"answered {call_id} {is_error}")

    fold = UiFold(Recorder())
    for e in loop.log.events():
        fold.feed(e)
    assert seen == ["requested c1", "resolved denied", "answered c1 True"]


@pytest.mark.parametrize("kind", ["decision/requested", "decision/resolved"])
def test_the_decision_types_are_the_loops_own(kind: str) -> None:
    log = kerman.MemoryStore().create()
    with pytest.raises(ValueError):
        log.append(kind, json.loads('{"decisionId": "forged"}'))
