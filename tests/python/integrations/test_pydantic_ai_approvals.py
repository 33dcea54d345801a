"""Deferred tool approvals under KermanDurability are Kerman decisions: a run that pauses for
approvals asks one ``decision/requested`` per call (outside any turn, ``for`` the run), a person
decides with ``store.decide`` from another process (FileStore, PostgresStore), and the next run
goes on from the session alone (``durability.deferred()``); a process killed right after the
requests are durable resumes without asking again or calling the model again."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from pai_approval_agent import PROMPT, build, lines  # noqa: E402
from pydantic_ai import DeferredToolRequests  # noqa: E402
from pydantic_ai.exceptions import UserError  # noqa: E402

import kerman  # noqa: E402
import kerman.decisions as kd  # noqa: E402
from conftest import fresh_schema_dsn  # noqa: E402
from kerman.integrations.pydantic_ai import RUN, RUN_END, UNIT, KermanDurability  # noqa: E402

CHILD = Path(__file__).with_name("pai_approval_agent.py")
DECISIONS = {"r7": "approve", "r8": "deny:over the limit"}
EXPECTED = "r7: refunded 5 on order 7; r8: over the limit"


def _child(kind: str, where: str, trace: Path, mode: str, extra: str = "") -> subprocess.CompletedProcess[str]:
    args = [sys.executable, str(CHILD), kind, where, "s", str(trace), mode] + ([extra] if extra else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_a_paused_run_asks_one_decision_per_call_and_goes_on_once_decided(tmp_path):
    store = kerman.FileStore(str(tmp_path / "sessions"))
    durability = KermanDurability(store, session_id="s")
    agent = build(tmp_path, [durability])
    paused = asyncio.run(agent.run(PROMPT)).output
    assert isinstance(paused, DeferredToolRequests)
    # The session was let go, so another process can decide; its requests are the core's.
    follower = store.follow("s")
    pending = kd.pending(follower)
    assert [(p.call_id, p.name, json.loads(p.arguments), p.kind) for p in pending] == [
        ("r7", "refund", {"order": 7, "amount": 5}, "approval"),
        ("r8", "refund", {"order": 8, "amount": 900}, "approval"),
    ]
    requested = [e for e in follower.events(view=True) if e.type == "decision/requested"]
    assert [r.requester for r in requested] == [{"kind": "pydantic-ai", "run": 1}] * 2
    assert [e.type for e in follower.events()] == [RUN, UNIT, "decision/requested", "decision/requested", RUN_END]
    assert "messages" in follower[-1].data
    follower.close()
    with pytest.raises(UserError, match=r"run 1 waits for decisions on refund \(.+\), refund \(.+\)"):
        durability.deferred()
    durability.close()
    assert store.decide("s", pending[0].decision_id, kerman.Approve(), by="ops")["applied"]
    assert store.decide("s", pending[1].decision_id, kerman.Deny("over the limit"))["applied"]
    refused = store.decide("s", pending[1].decision_id, kerman.Approve())
    assert (refused["applied"], refused["reason"]) == (False, "resolved")
    result = asyncio.run(agent.run(**durability.deferred()))
    assert result.output == EXPECTED
    assert lines(tmp_path, "refund.log") == ["7:5"]
    assert lines(tmp_path, "model.log") == ["0", "2"]
    assert durability.deferred() is None  # the last run did not pause
    durability.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["run", "run-die"])
def test_decided_from_another_process_after_a_pause_or_a_kill(tmp_path, mode):
    where = str(tmp_path / "sessions")
    trace = tmp_path / "trace"
    trace.mkdir()
    first = _child("file", where, trace, mode)
    if mode == "run-die":
        assert first.returncode == -signal.SIGKILL, first.stderr
    else:
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout) == ["paused", ["r7", "r8"]]
    decided = _child("file", where, trace, "decide", json.dumps(DECISIONS))
    assert decided.returncode == 0, decided.stderr
    assert all(answer["applied"] for answer in json.loads(decided.stdout).values()), decided.stdout
    resumed = _child("file", where, trace, "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == EXPECTED
    # The model's first answer was asked once (the resumed run replayed it), the approved refund
    # ran once, the denied one never, and no call was asked about twice.
    assert lines(trace, "model.log") == ["0", "2"]
    assert lines(trace, "refund.log") == ["7:5"]
    log = kerman.FileStore(where).open("s")
    try:
        assert len(list(log.events(types=["decision/requested"]))) == 2
        assert [e.data["outcome"] for e in log.events(types=["decision/resolved"])] == ["approved", "denied"]
    finally:
        log.close()


@pytest.mark.timeout(120)
def test_a_postgres_owner_applies_a_decision_staged_by_another_process(tmp_path):
    dsn = fresh_schema_dsn()
    durability = KermanDurability(kerman.PostgresStore(dsn, lease_ttl=0), session_id="s")
    agent = build(tmp_path, [durability])
    assert isinstance(asyncio.run(agent.run(PROMPT)).output, DeferredToolRequests)
    other = kerman.PostgresStore(dsn)
    follower = other.follow("s")
    pending = {p.call_id: p.decision_id for p in kd.pending(follower)}
    follower.close()
    # This process still owns the session: the staged decisions are applied by its inbox.
    assert other.decide("s", pending["r7"], kerman.Approve(), by="ops", timeout=30)["applied"]
    assert other.decide("s", pending["r8"], kerman.Deny("over the limit"), timeout=30)["applied"]
    result = asyncio.run(agent.run(**durability.deferred()))
    assert result.output == EXPECTED
    assert lines(tmp_path, "refund.log") == ["7:5"]
    durability.close()


def test_the_ui_streams_show_the_requests(tmp_path):
    from kerman.ui import agui, vercel

    durability = KermanDurability(kerman.MemoryStore(), session_id="s")
    asyncio.run(build(tmp_path, [durability]).run(PROMPT))
    ids = [r.decision_id for r in kd.pending(durability.log)]
    updates = [u.data for u in agui(durability.log.events(), thread_id="s")]
    started = [u["toolCallId"] for u in updates if u["type"] == "TOOL_CALL_START"]
    asked = [u["value"]["decisionId"] for u in updates if u["type"] == "CUSTOM" and u["name"] == "kerman.decision/requested"]
    assert (started, asked) == (["r7", "r8"], ids)
    parts = [u.data for u in vercel(durability.log.events())]
    approvals = [(p["toolCallId"], p["approvalId"]) for p in parts if p["type"] == "tool-approval-request"]
    assert approvals == list(zip(["r7", "r8"], ids, strict=True))
    durability.close()


@pytest.mark.timeout(180)
def test_kerman_serve_lists_and_decides_them(tmp_path):
    """`kerman serve` over PostgreSQL follows the session, lists the run's requests with its
    decision route and decides them through the store; this process, the session's owner,
    applies them, and the next run goes on."""
    pytest.importorskip("starlette")
    sys.path.insert(0, str(Path(__file__).parents[1] / "web"))
    from web_helpers import Server

    dsn = fresh_schema_dsn()
    durability = KermanDurability(kerman.PostgresStore(dsn, lease_ttl=0), session_id="s")
    agent = build(tmp_path, [durability])
    assert isinstance(asyncio.run(agent.run(PROMPT)).output, DeferredToolRequests)
    with Server(dsn) as server, server.client() as client:
        listed = client.get("/sessions/s/decisions")
        assert listed.status_code == 200, listed.text
        requests = {d["call_id"]: d for d in listed.json()["decisions"]}
        assert sorted(requests) == ["r7", "r8"] and requests["r7"]["name"] == "refund"
        assert requests["r7"]["requester"]["kind"] == "pydantic-ai", requests["r7"]
        for call_id, body in (("r7", {"outcome": "approve", "by": "ops"}), ("r8", {"outcome": "deny", "reason": "over the limit"})):
            answer = client.post(f"/sessions/s/decisions/{requests[call_id]['decision_id']}", json=body)
            assert answer.status_code == 200, answer.text
        assert client.get("/sessions/s/decisions").json()["decisions"] == []
    result = asyncio.run(agent.run(**durability.deferred()))
    assert result.output == EXPECTED
    assert lines(tmp_path, "refund.log") == ["7:5"]
    durability.close()
