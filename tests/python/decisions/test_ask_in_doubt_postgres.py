"""``on_in_doubt="ask"`` over PostgreSQL (docs/durability.md, "Calls in doubt"): the owner is
SIGKILLed while the tool body runs; a ``Worker`` takes the session over when the dead lease
lapses (its open writes the ``decision/requested`` of kind ``in-doubt``, the turn waits), a
separate process decides with ``PostgresStore.decide``, and the worker's loop applies it: the
call gets exactly one result, and the tool ran per the decision (counted in a file)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from ask_pg_child import build
from test_store_decide import DEADLINE, decide_elsewhere, runs, until

from conftest import fresh_schema_dsn, needs_postgres
from kerman import ModelReply, PostgresStore, Worker

pytestmark = [needs_postgres, pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")]

CHILD = str(Path(__file__).with_name("ask_pg_child.py"))
TTL = 1.0  # the dead owner's lease: how long the worker waits to take the session over


def killed_mid_call(dsn: str, counter: Path, tool: str) -> None:
    with subprocess.Popen([sys.executable, CHILD, dsn, "s", str(counter), tool, str(TTL)], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "IN_BODY", line
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def logged(dsn: str) -> List[Any]:
    follower = PostgresStore(dsn).follow("s")
    try:
        return list(follower.events())
    finally:
        follower.close()


def text_of(result: Dict[str, Any]) -> str:
    [block] = result["message"]["content"]
    return "".join(part["text"] for part in block["content"])


@pytest.mark.parametrize(
    "tool, outcome, text, ran",
    [
        ("ask_read", {"kind": "approve"}, "ask_read ran", ["ask_read", "ask_read"]),  # run again
        ("ask_write", {"kind": "answer", "value": "paid: receipt 7"}, "paid: receipt 7", ["ask_write"]),  # recorded
    ],
)
def test_a_worker_applies_a_decision_about_a_call_in_doubt(
    tmp_path: Path, tool: str, outcome: Dict[str, Any], text: str, ran: List[str]
) -> None:
    dsn, counter = fresh_schema_dsn(), tmp_path / "runs.jsonl"
    killed_mid_call(dsn, counter, tool)
    assert [r["tool"] for r in runs(counter)] == [tool]

    async def model(request: Any) -> Any:
        return ModelReply("answered")

    async def main() -> None:
        worker = Worker(PostgresStore(dsn, lease_ttl=TTL), lambda log: build(model, log, str(counter)), idle_timeout=60.0)
        serving = asyncio.ensure_future(worker.run())
        try:

            def requested() -> List[Dict[str, Any]]:
                return [e.data for e in logged(dsn) if e.type == "decision/requested"]

            await until(requested, "the worker to take the dead session and ask about the call")
            [request] = requested()
            assert request["kind"] == "in-doubt" and request["callId"] == "c1"
            out = await decide_elsewhere(dsn, "s", request["decisionId"], outcome, "k1")
            assert out["applied"] is True and out["duplicate"] is False, out

            def ends() -> List[str]:
                return [e.data["reason"]["kind"] for e in logged(dsn) if e.type == "turn/end"]

            await until(lambda: ends() == ["completed"], "the worker to apply the decision and end the turn")
        finally:
            worker.stop()
            await asyncio.wait_for(serving, DEADLINE)

    asyncio.run(asyncio.wait_for(main(), DEADLINE * 3))
    all_events = logged(dsn)
    assert [e.data["callId"] for e in all_events if e.type == "tool/call"] == ["c1"]
    results = [e.data for e in all_events if e.type == "tool/result"]
    assert [r["message"]["source"]["callId"] for r in results] == ["c1"]
    assert "error" not in results[0] and text_of(results[0]) == text
    assert len([e for e in all_events if e.type == "decision/resolved"]) == 1
    executed = runs(counter)
    assert [r["tool"] for r in executed] == ran and len({r["key"] for r in executed}) == 1
    assert [e.data["turn"] for e in all_events if e.type == "turn/start"] == [1]
