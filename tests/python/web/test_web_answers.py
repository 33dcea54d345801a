"""An answer decided over HTTP (docs/web.md, "Decisions") is checked against its request's
schema: one the schema refuses is a 422 ``invalid-decision`` naming the problem, and nothing is
applied; one it accepts is the call's result."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Dict, List

import pytest
from web_helpers import Server

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

DEADLINE = 60.0


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


def test_an_answer_that_does_not_match_the_schema_is_refused_over_http(tmp_path: Path) -> None:
    with Server(str(tmp_path / "sessions"), "--model", "answer_models:factory") as server, server.client() as client:
        session_id = f"s-{uuid.uuid4().hex[:12]}"
        assert client.post("/sessions", json={"id": session_id}).status_code == 201
        assert client.post(f"/sessions/{session_id}/messages", json={"text": "ask"}).status_code == 201
        [request] = wait_for(lambda: pending(client, session_id), "the question")
        assert request["kind"] == "answer" and request["schema"]["required"] == ["colour"]
        path = f"/sessions/{session_id}/decisions/{request['decision_id']}"
        refused = client.post(path, json={"outcome": "answer", "value": {"colour": "green"}, "key": "k1"})
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid-decision" and "is not one of" in error["message"] and "$.colour" in error["message"], error
        assert [r["decision_id"] for r in pending(client, session_id)] == [request["decision_id"]]
        applied = client.post(path, json={"outcome": "answer", "value": {"colour": "blue"}, "key": "k2"})
        assert applied.status_code == 200 and applied.json()["duplicate"] is False, applied.text
        wait_for(lambda: pending(client, session_id) == [], "the question to be answered")
