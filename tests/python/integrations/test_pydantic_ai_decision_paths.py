"""The paths of pydantic-ai's deferred approvals under KermanDurability beyond a plain decision
(issue 30): a request with a deadline (``ApprovalRequired(metadata={"kerman_expires_at": ...})``)
is logged expired when a decision or the next run finds it past, cancelling the run's requests,
deciding through ``kerman serve`` over a FileStore, and deciding on PostgreSQL after the process
that held the session was killed. In each, the next ``agent.run(**durability.deferred())`` sees
what pydantic-ai expects of a call nobody approved: a ``ToolDenied``, its message sent to the
model, the tool never run."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from pai_deadline_agent import PROMPT, build, lines  # noqa: E402
from pydantic_ai import DeferredToolRequests  # noqa: E402
from pydantic_ai.exceptions import UserError  # noqa: E402

import kerman  # noqa: E402
import kerman.decisions as kd  # noqa: E402
from conftest import fresh_schema_dsn  # noqa: E402
from kerman.integrations import pydantic_ai_approvals as approvals  # noqa: E402
from kerman.integrations.pydantic_ai import RUN, RUN_END, STARTED, UNIT, KermanDurability  # noqa: E402

CHILD = Path(__file__).with_name("pai_deadline_agent.py")
PAST = 1_000_000_000  # 2001: any deadline there has passed
REFUNDED_7 = "r7: refunded 5 on order 7"


def _paused(tmp_path: Path, metadata=None):
    store = kerman.FileStore(str(tmp_path / "sessions"))
    durability = KermanDurability(store, session_id="s")
    agent = build(tmp_path, [durability], metadata)
    assert isinstance(asyncio.run(agent.run(PROMPT)).output, DeferredToolRequests)
    follower = store.follow("s")
    ids = {p.call_id: p for p in kd.pending(follower)}
    follower.close()
    return store, durability, agent, ids


def _outcomes(store: kerman.FileStore) -> list[tuple[str, str]]:
    log = store.follow("s")
    try:
        return [(e.data["callId"], e.data["outcome"]) for e in log.events(types=["decision/resolved"])]
    finally:
        log.close()


def test_a_request_past_its_deadline_is_refused_expired_and_the_next_run_gets_a_denial(tmp_path):
    store, durability, agent, pending = _paused(tmp_path, {8: {"kerman_expires_at": PAST}})
    assert (pending["r7"].expires_at, pending["r8"].expires_at) == (None, PAST * 1000)
    refused = store.decide("s", pending["r8"].decision_id, kerman.Approve(), by="ops")
    assert (refused["applied"], refused["reason"]) == (False, "expired")
    assert store.decide("s", pending["r7"].decision_id, kerman.Approve(), by="ops")["applied"]
    assert _outcomes(store) == [("r8", "expired"), ("r7", "approved")]
    result = asyncio.run(agent.run(**durability.deferred()))
    assert result.output == f"{REFUNDED_7}; r8: The tool call was not approved (expired)."
    assert lines(tmp_path, "refund.log") == ["7:5"]
    durability.close()


def test_the_next_run_logs_what_expired_meanwhile_and_names_what_still_waits(tmp_path):
    store, durability, agent, pending = _paused(tmp_path, {7: {"kerman_expires_in": 3600}, 8: {"kerman_expires_at": PAST}})
    now_ms = time.time() * 1000
    assert now_ms < pending["r7"].expires_at <= now_ms + 3_600_000
    # r7's deadline is an hour away: still pending, named; r8's passed: logged expired now.
    with pytest.raises(UserError, match=r"waits for decisions on refund \(" + pending["r7"].decision_id + r"\): decide"):
        durability.deferred()
    durability.close()
    assert _outcomes(store) == [("r8", "expired")]
    assert store.decide("s", pending["r7"].decision_id, kerman.Deny("not today"))["applied"]
    result = asyncio.run(agent.run(**durability.deferred()))
    assert result.output == "r7: not today; r8: The tool call was not approved (expired)."
    assert lines(tmp_path, "refund.log") == []
    assert _outcomes(store) == [("r8", "expired"), ("r7", "denied")]  # expired once, not again
    durability.close()


def test_cancelling_a_paused_run_resolves_its_requests_cancelled(tmp_path):
    store, durability, agent, pending = _paused(tmp_path)
    assert store.decide("s", pending["r7"].decision_id, kerman.Approve())["applied"]
    assert approvals.cancel(durability.log) == 1  # r8; r7 was decided already
    assert approvals.cancel(durability.log) == 0
    durability.close()
    assert _outcomes(store) == [("r7", "approved"), ("r8", "cancelled")]
    refused = store.decide("s", pending["r8"].decision_id, kerman.Approve())
    assert (refused["applied"], refused["reason"]) == (False, "resolved")
    assert "cancelled" in refused["detail"]
    result = asyncio.run(agent.run(**durability.deferred()))
    assert result.output == f"{REFUNDED_7}; r8: The tool call was not approved (cancelled)."
    assert lines(tmp_path, "refund.log") == ["7:5"]
    durability.close()


def test_a_loop_s_cancel_leaves_another_framework_s_requests_to_it(tmp_path):
    """``loop.cancel()`` cancels the loop's own turn: a loop opened over the session (``kerman
    serve`` builds one) lists the run's requests but does not cancel them; ``approvals.cancel``
    does."""
    store, durability, agent, pending = _paused(tmp_path)
    loop = kerman.AgentLoop(kerman.models.EchoModel(), log=store.open("s"))
    try:
        assert sorted(r.call_id for r in loop.decisions) == ["r7", "r8"]
        loop.cancel()
        assert loop.status == "idle"
        assert sorted(r.call_id for r in loop.decisions) == ["r7", "r8"]
    finally:
        asyncio.run(loop.aclose())
        loop.log.close()
    assert _outcomes(store) == []


def test_kerman_serve_over_a_file_store_decides_and_holds_the_session_until_it_lets_go(tmp_path):
    pytest.importorskip("starlette")
    sys.path.insert(0, str(Path(__file__).parents[1] / "web"))
    from web_helpers import Server

    store, durability, agent, pending = _paused(tmp_path)
    server = Server(str(tmp_path / "sessions"), "--model", "kerman.models:EchoModel")
    try:
        with server.client() as client:
            listed = client.get("/sessions/s/decisions")
            assert listed.status_code == 200, listed.text
            assert sorted(d["call_id"] for d in listed.json()["decisions"]) == ["r7", "r8"]
            for call_id, body in (("r7", {"outcome": "approve", "by": "ops"}), ("r8", {"outcome": "deny", "reason": "over the limit"})):
                answer = client.post(f"/sessions/s/decisions/{pending[call_id].decision_id}", json=body)
                assert answer.status_code == 200, answer.text
            assert client.get("/sessions/s/decisions").json()["decisions"] == []
        # Each 200 came once the decision was durable. The server owns the session now (a file
        # session has one process at a time): the next run is refused, naming the lock.
        with pytest.raises(kerman.SessionLockedError, match='"s"'):
            durability.deferred()
        assert _outcomes(store) == [("r7", "approved"), ("r8", "denied")]
    finally:
        assert server.stop() in (0, -signal.SIGTERM), "".join(server.stderr)
    result = asyncio.run(agent.run(**durability.deferred()))
    assert result.output == f"{REFUNDED_7}; r8: over the limit"
    assert lines(tmp_path, "refund.log") == ["7:5"]
    log = store.follow("s")
    try:  # the server's loop wrote nothing of its own into the run's session
        assert {e.type for e in log.events()} <= {RUN, UNIT, STARTED, RUN_END, "decision/requested", "decision/resolved"}
    finally:
        log.close()
    durability.close()


@pytest.mark.timeout(180)
def test_a_postgres_decision_after_the_owner_was_killed_is_recorded_and_the_run_goes_on(tmp_path):
    dsn = fresh_schema_dsn()
    trace = tmp_path / "trace"
    trace.mkdir()
    holder = subprocess.Popen(
        [sys.executable, str(CHILD), dsn, "s", str(trace), "hold"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        said, ids = json.loads(holder.stdout.readline() or '["died", {}]')
        assert said == "paused"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=30)  # reaps it and closes its pipes
    assert holder.returncode == -signal.SIGKILL
    decisions = {"r7": "approve", "r8": "deny:over the limit"}
    decided = subprocess.run(
        [sys.executable, str(CHILD), dsn, "s", str(trace), "decide", json.dumps(decisions)], capture_output=True, text=True, timeout=60
    )
    assert decided.returncode == 0, decided.stderr
    answers = json.loads(decided.stdout)
    assert [answers[c]["applied"] for c in ("r7", "r8")] == [True, True], answers
    assert {c: answers[c]["decision_id"] for c in answers} == ids
    # The same key again is a duplicate, applied once.
    again = kerman.PostgresStore(dsn).decide("s", ids["r7"], kerman.Approve(), by="ops", key="k-r7", timeout=5)
    assert (again["applied"], again["duplicate"]) == (True, True)
    resumed = subprocess.run([sys.executable, str(CHILD), dsn, "s", str(trace), "resume"], capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == f"{REFUNDED_7}; r8: over the limit"
    assert lines(trace, "refund.log") == ["7:5"]
    assert lines(trace, "model.log") == ["0", "2"]
    log = kerman.PostgresStore(dsn).follow("s")
    try:
        assert [e.data["outcome"] for e in log.events(types=["decision/resolved"])] == ["approved", "denied"]
    finally:
        log.close()
