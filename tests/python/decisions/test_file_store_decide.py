"""`FileStore.decide` (docs/decisions.md, "Deciding from another process"): a session no process
has open is opened, decided and closed by another process; the next `AgentLoop` over it runs the
decided call once, without asking the model again. A session a process holds is refused with
`SessionLockedError` (its owner decides with `loop.decide`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest

from kerman import AgentLoop, Approve, FileStore, ModelReply, SessionLockedError

DECIDER = textwrap.dedent("""
    import json, sys
    from kerman import FileStore
    from kerman.decisions import outcome_of
    root, sid, decision_id, outcome, key = sys.argv[1:6]
    print(json.dumps(FileStore(root).decide(sid, decision_id, outcome_of(json.loads(outcome)), by="ops", key=key or None)))
""")


def decide_elsewhere(root: Path, decision_id: str, outcome: Dict[str, Any], key: str = "") -> Dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", DECIDER, str(root), "s", decision_id, json.dumps(outcome), key], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    answer: Dict[str, Any] = json.loads(done.stdout)
    return answer


def build(log: Any, ran: List[int], requests: List[int]) -> AgentLoop:
    async def model(request: Any) -> Any:
        requests.append(request.step)
        if request.step == 1:
            return ModelReply([{"type": "tool-call", "id": "c1", "name": "pay", "arguments": '{"amount": 5}'}])
        return ModelReply("done")

    loop = AgentLoop(model, log=log)

    @loop.tool(needs_approval=True)
    async def pay(amount: int) -> str:
        """Pays."""
        ran.append(amount)
        return "paid"

    return loop


def test_a_session_nobody_has_open_is_decided_by_another_process(tmp_path: Path) -> None:
    root, ran, requests = tmp_path / "store", [], []
    store = FileStore(root, durability="none")

    async def ask() -> str:
        log = store.create("s")
        loop = build(log, ran, requests)
        loop.followup("pay")
        await loop.when_idle()
        [pending] = loop.decisions
        # Held here: another process cannot decide (it would have to own the session).
        with pytest.raises(SessionLockedError):
            store.decide("s", pending.decision_id, Approve())
        await loop.aclose()
        log.close()
        return pending.decision_id

    decision_id = asyncio.run(ask())
    unknown = decide_elsewhere(root, "no-such-decision", {"kind": "approve"})
    assert (unknown["applied"], unknown["reason"]) == (False, "unknown"), unknown
    invalid = decide_elsewhere(root, decision_id, {"kind": "answer", "value": 1})
    assert (invalid["applied"], invalid["reason"]) == (False, "invalid"), invalid
    out = decide_elsewhere(root, decision_id, {"kind": "edit", "arguments": {"amount": 3}}, "k")
    assert out == {"applied": True, "op": "decide", "decision_id": decision_id, "duplicate": False}, out
    again = decide_elsewhere(root, decision_id, {"kind": "edit", "arguments": {"amount": 3}}, "k")
    assert again["applied"] is True and again["duplicate"] is True, again
    other = decide_elsewhere(root, decision_id, {"kind": "approve"}, "k2")
    assert (other["applied"], other["reason"]) == (False, "resolved"), other
    assert ran == []

    async def resume() -> None:
        log = store.open("s")
        loop = build(log, ran, requests)
        assert loop.decisions == [] and loop.status == "idle"
        loop.wake()  # every request is decided: the step goes on
        await loop.when_idle()
        assert [e.data["reason"]["kind"] for e in log.events() if e.type == "turn/end"] == ["completed"]
        [resolved] = [e.data for e in log.events() if e.type == "decision/resolved"]
        assert (resolved["outcome"], resolved["by"], resolved["key"]) == ("edited", "ops", "k")
        await loop.aclose()
        log.close()

    asyncio.run(resume())
    assert ran == [3]
    assert requests == [1, 2]
