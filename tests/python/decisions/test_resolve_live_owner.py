"""``PostgresStore.resolve`` of a session a live process owns (docs/durability.md, "Settling a
call in doubt by hand"): the owner is SIGKILLed inside the body of an ``on_in_doubt="ask"``
tool; a ``Worker`` takes the session over (the turn waits for a person); a separate process
records the call's result with ``store.resolve``, which is staged for the worker and applied
by its loop. The call gets that one result and nothing runs again; the waiting turn is closed
and the worker continues it, so its input is answered; a second resolve, and one for a call
that is not in doubt, are refused with ``ValueError`` in the calling process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest
from ask_pg_child import build
from test_ask_in_doubt_postgres import TTL, killed_mid_call, logged, text_of
from test_store_decide import DEADLINE, runs, until

from conftest import fresh_schema_dsn, needs_postgres
from kerman import ModelReply, PostgresStore, Worker
from kerman.decisions import pending

pytestmark = [needs_postgres, pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")]

RESOLVER = textwrap.dedent("""
    import json, sys
    from kerman import PostgresStore
    dsn, sid, call_id, text, timeout = sys.argv[1:6]
    try:
        print(json.dumps({"seq": PostgresStore(dsn).resolve(sid, call_id, text, timeout=float(timeout))}))
    except Exception as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
""")


def resolve_elsewhere(dsn: str, call_id: str, text: str, timeout: float = 20.0) -> Dict[str, Any]:
    args = [sys.executable, "-c", RESOLVER, dsn, "s", call_id, text, str(timeout)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_worker_records_the_result_another_process_resolves(tmp_path: Path) -> None:
    dsn, counter = fresh_schema_dsn(), tmp_path / "runs.jsonl"
    killed_mid_call(dsn, counter, "ask_write")
    requests: List[List[str]] = []

    async def model(request: Any) -> Any:
        requests.append([m.role for m in request.messages])
        return ModelReply("answered")

    async def main() -> None:
        store = PostgresStore(dsn, lease_ttl=TTL)
        worker = Worker(store, lambda log: build(model, log, str(counter)), idle_timeout=60.0)
        serving = asyncio.ensure_future(worker.run())
        try:

            def requested() -> List[Dict[str, Any]]:
                return [e.data for e in logged(dsn) if e.type == "decision/requested"]

            await until(requested, "the worker to take the dead session and ask about the call")
            [row] = store.sessions("s")
            assert row["owner"] is not None  # a live owner: the worker
            refused = await asyncio.to_thread(resolve_elsewhere, dsn, "c9", "nothing")
            assert refused["error"] == "ValueError" and 'call "c9" is not in doubt' in refused["message"], refused
            done = await asyncio.to_thread(resolve_elsewhere, dsn, "c1", "paid by hand")
            assert "seq" in done, done
            again = await asyncio.to_thread(resolve_elsewhere, dsn, "c1", "paid twice")
            assert again["error"] == "ValueError" and 'call "c1" is not in doubt' in again["message"], again

            def ends() -> List[str]:
                return [e.data["reason"]["kind"] for e in logged(dsn) if e.type == "turn/end"]

            # The result closed the waiting turn; the worker's loop continues it (its input
            # gets its answer) and takes nothing else.
            await until(lambda: ends() == ["interrupted", "completed"], "the worker to continue the turn")
        finally:
            worker.stop()
            await asyncio.wait_for(serving, DEADLINE)
        return done["seq"]

    seq = asyncio.run(asyncio.wait_for(main(), DEADLINE * 3))
    all_events = logged(dsn)
    [call] = [e for e in all_events if e.type == "tool/call"]
    [result] = [e for e in all_events if e.type == "tool/result"]
    assert result.seq == seq and result.source_event_seqs == [call.seq]
    assert "error" not in result.data and text_of(result.data) == "paid by hand"
    assert [r["tool"] for r in runs(counter)] == ["ask_write"]  # it never ran again
    # The request about the call is answered by its result: nothing stays pending.
    follower = PostgresStore(dsn).follow("s")
    try:
        assert pending(follower) == []
    finally:
        follower.close()
    assert [e.data.get("continues") for e in all_events if e.type == "turn/start"] == [None, 1]
    # The model was asked once more, over the history with the recorded result, and answered.
    assert requests == [["user", "assistant", "user"]]
    [answer] = [e.data for e in all_events if e.type == "assistant/message" and e.data["turn"] == 2]
    assert answer["message"]["content"] == [{"type": "text", "text": "answered"}]


HOLDER = textwrap.dedent("""
    import sys, time
    from kerman import PostgresStore, SessionLockedError
    dsn = sys.argv[1]
    deadline = time.monotonic() + 30
    while True:
        try:
            log = PostgresStore(dsn).open("s")
            break
        except SessionLockedError:
            assert time.monotonic() < deadline
            time.sleep(0.02)  # pacing the poll until the dead owner's lease lapses
    print("OPEN", flush=True)
    sys.stdin.read()
    log.close()
""")


def test_an_owner_that_does_not_apply_it_leaves_nothing_recorded(tmp_path: Path) -> None:
    """A process holding the session with no AgentLoop (a bare log reads no staged rows): the
    resolve is withdrawn after its timeout and raises, naming why."""
    dsn, counter = fresh_schema_dsn(), tmp_path / "runs.jsonl"
    killed_mid_call(dsn, counter, "ask_write")
    with subprocess.Popen([sys.executable, "-c", HOLDER, dsn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "OPEN"
        before = [e.seq for e in logged(dsn)]
        refused = resolve_elsewhere(dsn, "c1", "paid by hand", timeout=0.5)
        assert refused["error"] == "SessionLockedError", refused
        assert "timeout" in refused["message"] and "nothing was recorded" in refused["message"], refused
        assert [e.seq for e in logged(dsn)] == before
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0
    assert "seq" in resolve_elsewhere(dsn, "c1", "paid by hand")  # no owner now: recorded under the lease
    assert [e.type for e in logged(dsn)].count("tool/result") == 1
