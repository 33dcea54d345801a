"""The decision routes over HTTP (docs/web.md, "Decisions"): a real `kerman serve` lists what a
waiting turn asks (`GET /sessions/{id}/decisions`) and decides it (`POST
/sessions/{id}/decisions/{decision_id}`), over a file store (the server owns the session) and over
PostgreSQL (a `Worker` in this process owns it, in a schema of the test's own; the server hands
the decision to it through `store.decide`). The tool (decision_models.py) appends each run to a
file, so executions are counted across processes."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List

import pytest
from web_helpers import Server

import kerman
from conftest import fresh_schema_dsn, needs_postgres

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

DEADLINE = 60.0


def runs(counter: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in counter.read_text().splitlines()] if counter.exists() else []


def wait_for(predicate: Any, what: str) -> Any:
    deadline = time.monotonic() + DEADLINE
    while True:
        got = predicate()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def pending(client: Any, session_id: str) -> List[Dict[str, Any]]:
    response = client.get(f"/sessions/{session_id}/decisions")
    assert response.status_code == 200, response.text
    decisions: List[Dict[str, Any]] = response.json()["decisions"]
    return decisions


def error(response: Any, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code, response.text
    message: str = response.json()["error"]["message"]
    return message


def test_list_and_decide_over_http_when_the_server_owns_the_session(tmp_path: Path) -> None:
    counter = tmp_path / "runs.jsonl"
    with (
        Server(
            str(tmp_path / "sessions"), "--model", "decision_models:factory", "--token", "s3cret", env={"KERMAN_TEST_RUNS": str(counter)}
        ) as server,
        server.client(headers={"Authorization": "Bearer s3cret"}) as client,
    ):
        session_id = f"s-{uuid.uuid4().hex[:12]}"
        assert client.post("/sessions", json={"id": session_id}).status_code == 201
        assert pending(client, session_id) == []
        assert client.post(f"/sessions/{session_id}/messages", json={"text": "pay 5"}).status_code == 201
        [request] = wait_for(lambda: pending(client, session_id), "the request")
        assert (request["name"], json.loads(request["arguments"]), request["kind"]) == ("pay", {"amount": 5}, "approval")
        assert request["digest"].startswith("sha256:") and request["turn"] == 1
        assert request["requester"] is None  # the loop's own request
        decision_id = request["decision_id"]
        path = f"/sessions/{session_id}/decisions/{decision_id}"

        # Auth as the other routes.
        with server.client() as anonymous:
            assert anonymous.get(f"/sessions/{session_id}/decisions").status_code == 401
            assert anonymous.post(path, json={"outcome": "approve"}).status_code == 401
        # Bodies that decide nothing are refused before anything is applied.
        error(client.post(path, json={"outcome": "maybe"}), 422, "invalid-decision")
        error(client.post(path, json={"outcome": "edit", "arguments": [1]}), 422, "invalid-decision")
        error(client.post(path, json={"outcome": "approve", "reason": "x"}), 422, "invalid-decision")
        error(client.post(path, json={"outcome": "answer", "value": 1}), 422, "invalid-decision")  # an approval, not a question
        error(client.post(path, json={"outcome": "approve", "colour": "red"}), 400, "invalid-body")
        error(client.post(path, json={"outcome": "approve", "key": 7}), 400, "invalid-body")
        assert "no decision" in error(
            client.post(f"/sessions/{session_id}/decisions/nope", json={"outcome": "approve"}), 404, "decision-not-found"
        )
        assert runs(counter) == []

        decided = client.post(path, json={"outcome": "edit", "arguments": {"amount": 4}, "by": "alice", "key": "k1"})
        assert decided.status_code == 200, decided.text
        assert decided.json() == {"decision_id": decision_id, "outcome": "edit", "duplicate": False}
        wait_for(lambda: runs(counter), "the edited call to run")
        # A double click (same key): answered as a duplicate; another key: refused, naming why.
        again = client.post(path, json={"outcome": "edit", "arguments": {"amount": 4}, "by": "alice", "key": "k1"})
        assert again.status_code == 200 and again.json()["duplicate"] is True, again.text
        assert decision_id in error(client.post(path, json={"outcome": "deny", "key": "k2"}), 409, "decision-resolved")
        assert pending(client, session_id) == []
        assert runs(counter) == [{"amount": 4}]


@needs_postgres
def test_decide_over_http_while_a_worker_owns_the_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a schema of its own: the worker takes every takeable session of its schema, and in a
    shared one whatever other runs left there came first (one left waiting for a decision with
    input pending once blocked the worker's event loop, and this test timed out waiting for
    the ask)."""
    from decision_models import factory

    counter = tmp_path / "runs.jsonl"
    monkeypatch.setenv("KERMAN_TEST_RUNS", str(counter))  # the worker's tool runs in this process
    dsn = fresh_schema_dsn()
    session_id = f"web-{uuid.uuid4().hex[:10]}"
    with Server(dsn) as server, server.client() as client:
        assert client.post("/sessions", json={"id": session_id}).status_code == 201

        async def worker_and_ui() -> None:
            worker = kerman.Worker(kerman.PostgresStore(dsn), factory, idle_timeout=60.0)
            serving = asyncio.ensure_future(worker.run())

            def ui() -> None:
                assert client.post(f"/sessions/{session_id}/messages", json={"text": "pay 7"}).status_code == 201
                [request] = wait_for(lambda: pending(client, session_id), "the worker's loop to ask")
                path = f"/sessions/{session_id}/decisions/{request['decision_id']}"
                # Two clients deciding at once: one is applied, the other refused (another key).
                answers: List[Any] = []
                bodies = ({"outcome": "approve", "key": "a"}, {"outcome": "deny", "reason": "no", "key": "b"})
                threads = [threading.Thread(target=lambda b=b: answers.append(client.post(path, json=b))) for b in bodies]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                statuses = sorted(a.status_code for a in answers)
                assert statuses == [200, 409], [a.text for a in answers]
                winner = next(a for a in answers if a.status_code == 200).json()
                loser = next(a for a in answers if a.status_code == 409).json()
                assert loser["error"]["code"] == "decision-resolved", loser
                wait_for(lambda: pending(client, session_id) == [], "the request to be resolved")
                if winner["outcome"] == "approve":
                    wait_for(lambda: runs(counter), "the approved call to run")
                    assert runs(counter) == [{"amount": 7}]
                # The key applied again: a duplicate, through the owner as well.
                key = "a" if winner["outcome"] == "approve" else "b"
                again = client.post(path, json=bodies[0] if key == "a" else bodies[1])
                assert again.status_code == 200 and again.json()["duplicate"] is True, again.text
                error(client.post(f"/sessions/{session_id}/decisions/nope", json={"outcome": "approve"}), 404, "decision-not-found")

            try:
                await asyncio.wait_for(asyncio.to_thread(ui), DEADLINE * 2)
            finally:
                worker.stop()
                await asyncio.wait_for(serving, DEADLINE)

        asyncio.run(worker_and_ui())
        resolved = [e.data for e in kerman.PostgresStore(dsn).follow(session_id).events() if e.type == "decision/resolved"]
        assert len(resolved) == 1
        assert len(runs(counter)) == (1 if resolved[0]["outcome"] == "approved" else 0)
