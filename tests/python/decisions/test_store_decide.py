"""`PostgresStore.decide` (docs/decisions.md, "Deciding from another process"): a process that
does not own the session decides a pending request; the owner (an `AgentLoop`, or a `Worker`'s
loop) applies it in order with the input staged around it, through its own `loop.decide`, and
answers. The call runs once, with the decided arguments (counted in a file the tool appends to),
without asking the model again. Deciders are separate Python processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest

from conftest import fresh_schema_dsn, needs_postgres
from kerman import AgentLoop, Approve, ModelReply, PostgresStore, Worker

pytestmark = needs_postgres

DEADLINE = 30.0

DECIDER = textwrap.dedent("""
    import json, sys
    from kerman import PostgresStore
    from kerman.decisions import outcome_of
    dsn, sid, decision_id, outcome, key = sys.argv[1:6]
    out = PostgresStore(dsn).decide(sid, decision_id, outcome_of(json.loads(outcome)), by="ops",
                                    key=key or None, timeout=20.0)
    print(json.dumps(out))
""")


def decider(dsn: str, sid: str, decision_id: str, outcome: Dict[str, Any], key: str = "") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", DECIDER, dsn, sid, decision_id, json.dumps(outcome), key],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def answer(proc: subprocess.Popen[str]) -> Dict[str, Any]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out)


async def decide_elsewhere(dsn: str, sid: str, decision_id: str, outcome: Dict[str, Any], key: str = "") -> Dict[str, Any]:
    return await asyncio.to_thread(answer, decider(dsn, sid, decision_id, outcome, key))


def runs(counter: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in counter.read_text().splitlines()] if counter.exists() else []


def factory(counter: Path, requests: List[int]):
    """A loop whose model calls `pay` once (then says done) and whose `pay` needs approval and
    appends its arguments to `counter`."""

    def build(log: Any) -> AgentLoop:
        async def model(request: Any) -> Any:
            requests.append(request.step)
            if request.step == 1:
                return ModelReply([{"type": "tool-call", "id": "c1", "name": "pay", "arguments": '{"amount": 5}'}])
            return ModelReply("done")

        loop = AgentLoop(model, log=log)

        @loop.tool(needs_approval=True)
        async def pay(amount: int) -> str:
            """Pays."""
            with counter.open("a") as f:
                f.write(json.dumps({"amount": amount}) + "\n")
            return "paid"

        return loop

    return build


async def until(predicate: Any, what: str) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(poll(), DEADLINE)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def ends(log: Any) -> List[str]:
    return [e.data["reason"]["kind"] for e in log.events() if e.type == "turn/end"]


def resolutions(log: Any) -> List[Dict[str, Any]]:
    return [e.data for e in log.events() if e.type == "decision/resolved"]


def test_decided_from_another_process_while_an_agent_loop_owns_the_session(tmp_path: Path) -> None:
    dsn, counter, requests = fresh_schema_dsn(), tmp_path / "runs.jsonl", []

    async def main() -> None:
        log = PostgresStore(dsn).create("s")
        loop = factory(counter, requests)(log)
        loop.followup("pay five")
        await asyncio.wait_for(loop.when_idle(), DEADLINE)
        assert loop.status == "waiting"
        [pending] = loop.decisions

        out = await decide_elsewhere(dsn, "s", pending.decision_id, {"kind": "edit", "arguments": {"amount": 4}}, "k1")
        assert out == {"applied": True, "op": "decide", "decision_id": pending.decision_id, "duplicate": False}, out
        await until(lambda: ends(log) == ["completed"], "the step to resume and the turn to end")
        assert runs(counter) == [{"amount": 4}]
        assert requests == [1, 2]  # the model was not asked again for the decided call
        [resolved] = resolutions(log)
        assert resolved["by"] == "ops" and resolved["outcome"] == "edited", resolved

        # The same key again: deduplicated, nothing appended, nothing runs.
        again = await decide_elsewhere(dsn, "s", pending.decision_id, {"kind": "approve"}, "k1")
        assert again["applied"] is True and again["duplicate"] is True, again
        # Another key: refused, naming why.
        late = await decide_elsewhere(dsn, "s", pending.decision_id, {"kind": "approve"}, "k2")
        assert (late["applied"], late["reason"]) == (False, "resolved"), late
        assert pending.decision_id in late["detail"], late
        unknown = await decide_elsewhere(dsn, "s", "no-such-decision", {"kind": "approve"})
        assert (unknown["applied"], unknown["reason"]) == (False, "unknown"), unknown
        assert len(resolutions(log)) == 1 and runs(counter) == [{"amount": 4}]
        await loop.aclose()
        log.close()

    asyncio.run(asyncio.wait_for(main(), DEADLINE * 3))


def test_an_expired_request_is_refused_as_expired(tmp_path: Path) -> None:
    dsn, counter = fresh_schema_dsn(), tmp_path / "runs.jsonl"

    async def main() -> None:
        log = PostgresStore(dsn).create("s")
        loop = factory(counter, [])(log)

        @loop.before_tool
        async def soon(call: Any, next: Any) -> Any:
            from kerman import Ask

            return Ask(expires_at=1.0)  # long past: expired as soon as anyone looks

        loop.followup("pay")
        await asyncio.wait_for(loop.when_idle(), DEADLINE)
        decision_id = [e.data["decisionId"] for e in log.events() if e.type == "decision/requested"][0]
        out = await decide_elsewhere(dsn, "s", decision_id, {"kind": "approve"})
        assert (out["applied"], out["reason"]) == (False, "expired"), out
        await until(lambda: ends(log) == ["completed"], "the expired call's step to go on")
        assert runs(counter) == []
        assert [r["outcome"] for r in resolutions(log)] == ["expired"]
        await loop.aclose()
        log.close()

    asyncio.run(asyncio.wait_for(main(), DEADLINE * 3))


def test_a_worker_owning_the_session_applies_the_decision_and_runs_the_call_once(tmp_path: Path) -> None:
    dsn, counter, requests = fresh_schema_dsn(), tmp_path / "runs.jsonl", []

    async def main() -> None:
        web = PostgresStore(dsn)
        web.create("s").close()
        worker = Worker(PostgresStore(dsn), factory(counter, requests), idle_timeout=60.0)
        serving = asyncio.ensure_future(worker.run())
        try:
            web.enqueue("s", "pay five")

            def requested() -> List[str]:
                follower = web.follow("s")
                try:
                    return [e.data["decisionId"] for e in follower.events() if e.type == "decision/requested"]
                finally:
                    follower.close()

            await until(requested, "the worker's loop to ask")
            [decision_id] = requested()
            out = await decide_elsewhere(dsn, "s", decision_id, {"kind": "approve"}, "k")
            assert out["applied"] is True and out["duplicate"] is False, out

            def finished() -> bool:
                follower = web.follow("s")
                try:
                    return ends(follower) == ["completed"]
                finally:
                    follower.close()

            await until(finished, "the worker to run the approved call")
            assert runs(counter) == [{"amount": 5}]
            assert requests == [1, 2]
        finally:
            worker.stop()
            await asyncio.wait_for(serving, DEADLINE)

    asyncio.run(asyncio.wait_for(main(), DEADLINE * 3))


def test_a_decision_staged_while_nobody_owns_the_session_makes_a_worker_take_it(tmp_path: Path) -> None:
    """The owner closed while the call waited: the decision is staged durably; a worker takes
    the session for it, applies it and runs the call."""
    dsn, counter, requests = fresh_schema_dsn(), tmp_path / "runs.jsonl", []

    async def main() -> None:
        log = PostgresStore(dsn).create("s")
        loop = factory(counter, requests)(log)
        loop.followup("pay")
        await asyncio.wait_for(loop.when_idle(), DEADLINE)
        [pending] = loop.decisions
        await loop.aclose()
        log.close()

        worker = Worker(PostgresStore(dsn), factory(counter, requests), idle_timeout=60.0)
        serving = asyncio.ensure_future(worker.run())
        try:
            out = await decide_elsewhere(dsn, "s", pending.decision_id, {"kind": "deny", "reason": "no"}, "k")
            assert out["applied"] is True, out
            web = PostgresStore(dsn)

            def finished() -> bool:
                follower = web.follow("s")
                try:
                    return ends(follower) == ["completed"]
                finally:
                    follower.close()

            await until(finished, "the worker to resume the denied step")
            assert runs(counter) == []
        finally:
            worker.stop()
            await asyncio.wait_for(serving, DEADLINE)

    asyncio.run(asyncio.wait_for(main(), DEADLINE * 3))


@pytest.mark.parametrize("same_key", [False, True])
def test_two_processes_deciding_the_same_request_at_once(tmp_path: Path, same_key: bool) -> None:
    dsn, counter, requests = fresh_schema_dsn(), tmp_path / "runs.jsonl", []

    async def main() -> None:
        log = PostgresStore(dsn).create("s")
        loop = factory(counter, requests)(log)
        loop.followup("pay")
        await asyncio.wait_for(loop.when_idle(), DEADLINE)
        [pending] = loop.decisions
        a = decider(dsn, "s", pending.decision_id, {"kind": "edit", "arguments": {"amount": 1}}, "same" if same_key else "a")
        b = decider(dsn, "s", pending.decision_id, {"kind": "edit", "arguments": {"amount": 2}}, "same" if same_key else "b")
        outs = await asyncio.gather(asyncio.to_thread(answer, a), asyncio.to_thread(answer, b))
        await until(lambda: ends(log) == ["completed"], "the decided step to finish")
        applied = [o for o in outs if o["applied"] and not o.get("duplicate")]
        assert len(applied) == 1, outs
        other = [o for o in outs if o is not applied[0]][0]
        if same_key:
            assert other["applied"] is True and other["duplicate"] is True, outs
        else:
            assert (other["applied"], other["reason"]) == (False, "resolved"), outs
        assert len(resolutions(log)) == 1
        assert len(runs(counter)) == 1 and runs(counter)[0]["amount"] in (1, 2)
        await loop.aclose()
        log.close()

    asyncio.run(asyncio.wait_for(main(), DEADLINE * 3))


def test_the_outcome_is_checked_before_it_is_staged() -> None:
    web = PostgresStore(fresh_schema_dsn())
    web.create("s").close()
    with pytest.raises(TypeError, match="a decision is"):
        web.decide("s", "d", "approve")
    assert Approve().kind == "approve"
