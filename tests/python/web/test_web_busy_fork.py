"""kerman.web: a followup's ``on_busy`` on ``POST /messages`` and ``POST /sessions/{id}/fork``
(edit an earlier message and continue from there), over HTTP against a real `kerman serve`
(docs/context.md, docs/web.md). The model is web_models.py: ``slow`` streams "Starting" and
waits until cancelled; anything else is echoed."""

from __future__ import annotations

import json
import uuid

import pytest
from web_helpers import Server, Stream, run_finished

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(str(tmp_path_factory.mktemp("sessions")), "--model", "web_models:factory") as s:
        yield s


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


def new_session(client) -> str:
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    assert client.post("/sessions", json={"id": session_id}).status_code == 201
    return session_id


def post(client, session_id, text, **fields):
    return client.post(f"/sessions/{session_id}/messages", json={"text": text, **fields})


def events(client, session_id):
    """The session's log, read over the kerman protocol up to its last event."""
    total = client.get(f"/sessions/{session_id}").json()["events"]
    stream = Stream(client, f"/sessions/{session_id}/events?protocol=kerman")
    try:
        got = []
        while len(got) < total:
            got.append(json.loads(stream.next()[1]))
        return got
    finally:
        stream.close()


def user_texts(log):
    return ["".join(b["text"] for b in e["data"]["content"]) for e in log if e["type"] == "user/message"]


def endings(log):
    return [e["data"]["reason"] for e in log if e["type"] == "turn/end"]


def run_slow_then(client, session_id, text, on_busy):
    """Starts the slow turn, waits for its first chunk, then posts ``text`` with ``on_busy``;
    returns the response and the AG-UI events up to the end of the turn it lets run."""
    assert post(client, session_id, "slow").status_code == 201
    stream = Stream(client, f"/sessions/{session_id}/events")
    try:
        stream.until(lambda d: d["type"] == "TEXT_MESSAGE_CONTENT" and d["delta"] == "Starting")
        response = post(client, session_id, text, on_busy=on_busy)
        if on_busy == "reject":
            client.post(f"/sessions/{session_id}/cancel")
            seen = stream.until(run_finished)
        else:
            seen = stream.until(run_finished)
            seen += stream.until(run_finished)
    finally:
        stream.close()
    return response, [d for _, d in seen]


def test_reject_is_409_and_queues_nothing(client):
    session_id = new_session(client)
    response, _ = run_slow_then(client, session_id, "not now", "reject")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "busy" and session_id in error["message"] and 'on_busy="reject"' in error["message"]
    info = client.get(f"/sessions/{session_id}").json()
    assert info["queue"] == [] and info["status"] == "idle"
    assert "not now" not in user_texts(events(client, session_id))


def test_interrupt_cancels_the_turn_and_runs_the_followup(client):
    session_id = new_session(client)
    response, seen = run_slow_then(client, session_id, "instead", "interrupt")
    assert response.status_code == 201
    finished = [d for d in seen if d["type"] == "RUN_FINISHED"]
    assert finished[0]["result"]["reason"] == {"kind": "aborted", "reason": {"kind": "interrupt"}}
    log = events(client, session_id)
    assert endings(log)[-2:] == [{"kind": "aborted", "reason": {"kind": "interrupt"}}, {"kind": "completed"}]
    assert user_texts(log) == ["slow", "instead"]


def test_rollback_is_shown_as_rolled_back(client):
    session_id = new_session(client)
    response, seen = run_slow_then(client, session_id, "instead", "rollback")
    assert response.status_code == 201
    rolled = [d for d in seen if d["type"] == "CUSTOM" and d["name"] == "kerman.turn/rolled-back"]
    assert [d["value"] for d in rolled] == [{"turn": 1}]
    assert endings(events(client, session_id))[-2:] == [{"kind": "aborted", "reason": {"kind": "rollback"}}, {"kind": "completed"}]


@pytest.mark.parametrize(
    "fields, code",
    [({"on_busy": "later"}, "invalid-on-busy"), ({"on_busy": "reject", "delivery": "steer"}, "invalid-on-busy")],
)
def test_a_bad_on_busy_is_400_naming_it(client, fields, code):
    session_id = new_session(client)
    response = post(client, session_id, "x", **fields)
    assert response.status_code == 400 and response.json()["error"]["code"] == code
    assert repr(fields.get("delivery", fields["on_busy"]))[1:-1] in response.json()["error"]["message"]


def test_fork_at_an_earlier_message_continues_from_there(client):
    session_id = new_session(client)
    stream = Stream(client, f"/sessions/{session_id}/events")
    try:
        post(client, session_id, "first")
        stream.until(run_finished)
        post(client, session_id, "second")
        stream.until(run_finished)
    finally:
        stream.close()
    before = events(client, session_id)
    second = [e for e in before if e["type"] == "user/message"][1]["data"]["id"]
    response = client.post(f"/sessions/{session_id}/fork", json={"message_id": second, "text": "second, edited"})
    assert response.status_code == 201, response.text
    fork = response.json()
    assert fork["forkedFrom"]["id"] == session_id and response.headers["location"] == f"/sessions/{fork['id']}"
    stream = Stream(client, f"/sessions/{fork['id']}/events?protocol=kerman")
    try:
        stream.until(lambda e: e["type"] == "turn/end" and e["data"]["turn"] == 2)
    finally:
        stream.close()
    child = events(client, fork["id"])
    assert user_texts(child) == ["first", "second, edited"]
    assert [e for e in child if e["type"] == "turn/start"][-1]["data"] == {"turn": 2}
    assert events(client, session_id) == before, "the parent is unchanged"
    missing = client.post(f"/sessions/{session_id}/fork", json={"message_id": "nope", "text": "x"})
    assert missing.status_code == 404 and '"nope"' in missing.json()["error"]["message"]
    bad = client.post(f"/sessions/{session_id}/fork", json={"text": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid-message-id"
