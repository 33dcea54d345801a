"""kerman.web over HTTP: a real `kerman serve` process (uvicorn on 127.0.0.1) driven with httpx.

SSE resume after disconnects (every event exactly once, in order), heartbeats, queue edits from
two clients, cancel, auth on and off, CORS, and bad ids and bodies answered 4xx with a clear JSON
message. The model (web_models.py) does what the prompt says, so each test drives a turn through
the API alone."""

from __future__ import annotations

import json
import random
import signal
import uuid

import httpx
import pytest
from web_helpers import Server, Stream, kerman_turn_end, run_finished, vercel_finished

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(str(tmp_path_factory.mktemp("sessions")), "--model", "web_models:factory", "--heartbeat", "0.3") as s:
        yield s


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


def new_session(client) -> str:
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    response = client.post("/sessions", json={"id": session_id})
    assert response.status_code == 201, response.text
    assert response.json()["id"] == session_id
    return session_id


def send(client, session_id, text, delivery="followup") -> str:
    response = client.post(f"/sessions/{session_id}/messages", json={"text": text, "delivery": delivery})
    assert response.status_code == 201, response.text
    return response.json()["id"]


ENDS = {"agui": run_finished, "vercel": vercel_finished, "kerman": kerman_turn_end}


@pytest.mark.parametrize("protocol", sorted(ENDS))
def test_resume_after_disconnects_mid_turn_gives_every_event_once(client, protocol):
    session_id = new_session(client)
    send(client, session_id, "count 40")
    path = f"/sessions/{session_id}/events?protocol={protocol}"
    rng = random.Random(16)
    got: list = []
    last = None
    for _ in range(6):  # cut the stream after a few events, five times, then read to the end of the turn
        stream = Stream(client, path, last_event_id=last)
        try:
            for _ in range(rng.randint(1, 12)):
                item = stream.next()
                assert item is not None
                got.append((item[0], json.loads(item[1])))
                if ENDS[protocol](got[-1][1]):
                    break
        finally:
            stream.close()
        last = got[-1][0]
        if ENDS[protocol](got[-1][1]):
            break
    stream = Stream(client, path, last_event_id=last)
    try:
        if not ENDS[protocol](got[-1][1]):
            got += stream.until(ENDS[protocol])
    finally:
        stream.close()
    whole = Stream(client, path)  # one uninterrupted read of the same session
    try:
        expected = whole.until(ENDS[protocol])
    finally:
        whole.close()
    assert [i for i, _ in got] == [i for i, _ in expected]
    assert got == expected
    assert len({i for i, _ in got}) == len(got)
    if protocol == "agui":
        text = "".join(d["delta"] for _, d in got if d["type"] == "TEXT_MESSAGE_CONTENT" and d["messageId"].startswith("msg-"))
        assert text == "".join(f"{i} " for i in range(1, 41))
        assert sum(d["type"] == "TEXT_MESSAGE_START" for _, d in got) == 2  # the prompt and the reply, once each


def test_a_stream_resumes_with_the_after_parameter_too(client):
    session_id = new_session(client)
    send(client, session_id, "hello")
    stream = Stream(client, f"/sessions/{session_id}/events")
    try:
        full = stream.until(run_finished)
    finally:
        stream.close()
    middle = full[len(full) // 2][0]
    stream = Stream(client, f"/sessions/{session_id}/events?after={middle}")
    try:
        assert stream.until(run_finished) == full[len(full) // 2 + 1 :]
    finally:
        stream.close()


def test_vercel_stream_header(client):
    session_id = new_session(client)
    stream = Stream(client, f"/sessions/{session_id}/events?protocol=vercel")
    try:
        assert stream.response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        send(client, session_id, "hi")
        parts = [d for _, d in stream.until(vercel_finished)]
    finally:
        stream.close()
    assert [p["type"] for p in parts] == [
        "data-queue",
        "start",
        "data-queue",
        "start-step",
        "data-prompt",
        "text-start",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
    ]


def test_heartbeat_on_an_idle_stream(server):
    with server.client() as client:
        session_id = new_session(client)
        with client.stream("GET", f"/sessions/{session_id}/events") as response:
            for line in response.iter_lines():
                if line.startswith(":"):
                    break  # the heartbeat came (--heartbeat 0.3); the client's read timeout bounds the wait


def test_queue_edits_from_two_clients(server):
    with server.client() as one, server.client() as two:
        session_id = new_session(one)
        send(one, session_id, "use the tool")
        stream = Stream(one, f"/sessions/{session_id}/events")
        try:
            stream.until(lambda d: d["type"] == "TOOL_CALL_START")  # the turn is inside its tool call
            a = send(one, session_id, "queued A")
            b = send(two, session_id, "queued B")
            assert one.patch(f"/sessions/{session_id}/queue/{a}", json={"text": "A, edited by one"}).status_code == 200
            assert two.patch(f"/sessions/{session_id}/queue/{a}", json={"text": "A, edited by two"}).json() == {
                "id": a,
                "text": "A, edited by two",
            }
            assert two.delete(f"/sessions/{session_id}/queue/{b}").json() == {"id": b, "removed": True}
            late = one.patch(f"/sessions/{session_id}/queue/{b}", json={"text": "too late"})
            assert late.status_code == 409 and late.json()["error"]["code"] == "not-queued"
            assert b in late.json()["error"]["message"]
            again = one.delete(f"/sessions/{session_id}/queue/{b}")
            assert again.status_code == 409
            missing = one.delete(f"/sessions/{session_id}/queue/no-such-message")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "message-not-found"
            queue = one.get(f"/sessions/{session_id}").json()["queue"]
            assert [(q["id"], q["text"], q["placement"]) for q in queue] == [(a, "A, edited by two", "queued")]
            send(two, session_id, "keep it short", delivery="steer")  # releases the tool
            events = stream.until(run_finished)
            events += stream.until(run_finished)  # the next turn runs A
        finally:
            stream.close()
        claimed = one.patch(f"/sessions/{session_id}/queue/{a}", json={"text": "after the claim"})
        assert claimed.status_code == 409
    texts = [d["delta"] for _, d in events if d["type"] == "TEXT_MESSAGE_CONTENT"]
    assert "tool said: held for testing; steered by: keep it short" in "".join(texts)
    assert "A, edited by two" in texts and "echo: A, edited by two" in "".join(texts)
    assert not any("queued B" in t or "edited by one" in t for t in texts)
    custom = [d for _, d in events if d["type"] == "CUSTOM"]
    assert [c["name"] for c in custom] == ["kerman.steering"]


def test_cancel_keeping_the_inbox(client):
    session_id = new_session(client)
    send(client, session_id, "slow")
    queued = send(client, session_id, "after the slow one")
    stream = Stream(client, f"/sessions/{session_id}/events")
    try:
        stream.until(lambda d: d["type"] == "TEXT_MESSAGE_CONTENT" and d["delta"] == "Starting")
        response = client.post(f"/sessions/{session_id}/cancel", json={"keep_inbox": True})
        assert response.json() == {"cancelled": True, "keep_inbox": True}
        end = stream.until(run_finished)[-1][1]
        assert end["outcome"] == {"type": "cancelled"} and end["result"]["reason"]["reason"] == {"kind": "user"}
    finally:
        stream.close()
    info = client.get(f"/sessions/{session_id}").json()
    assert [q["id"] for q in info["queue"]] == [queued] and info["status"] == "idle"
    assert client.post(f"/sessions/{session_id}/cancel").json() == {"cancelled": False, "keep_inbox": False}


def test_a_failed_turn_ends_its_run_with_run_error(client):
    session_id = new_session(client)
    send(client, session_id, "fail")
    stream = Stream(client, f"/sessions/{session_id}/events")
    try:
        end = stream.until(run_finished)[-1][1]
    finally:
        stream.close()
    assert end == {"type": "RUN_ERROR", "timestamp": end["timestamp"], "message": "the model is down", "code": "TEST_FAILURE"}


def test_sessions_are_listed_and_created(client):
    made = client.post("/sessions")
    assert made.status_code == 201 and made.headers["location"] == f"/sessions/{made.json()['id']}"
    named = new_session(client)
    ids = [s["id"] for s in client.get("/sessions").json()["sessions"]]
    assert made.json()["id"] in ids and named in ids
    again = client.post("/sessions", json={"id": named})
    assert again.status_code == 409 and again.json()["error"]["code"] == "session-exists"


BAD = [
    ("GET", "/sessions/bad%20id", None, 400, "invalid-session-id"),
    ("GET", "/sessions/%2E%2E", None, 400, "invalid-session-id"),
    ("GET", "/sessions/-leading-dash", None, 400, "invalid-session-id"),
    ("GET", "/sessions/" + "x" * 129, None, 400, "invalid-session-id"),
    ("GET", "/sessions/no-such-session", None, 404, "session-not-found"),
    ("GET", "/sessions/no-such-session/events", None, 404, "session-not-found"),
    ("POST", "/sessions", b'{"id": "bad/id"}', 400, "invalid-session-id"),
    ("POST", "/sessions", b'{"id": 7}', 400, "invalid-session-id"),
    ("POST", "/sessions", b'{"name": "x"}', 400, "invalid-body"),
    ("POST", "/sessions/{s}/messages", b"{not json", 400, "invalid-json"),
    ("POST", "/sessions/{s}/messages", b"[1, 2]", 400, "invalid-body"),
    ("POST", "/sessions/{s}/messages", b"{}", 400, "invalid-text"),
    ("POST", "/sessions/{s}/messages", b'{"text": "  "}', 400, "invalid-text"),
    ("POST", "/sessions/{s}/messages", b'{"text": 5}', 400, "invalid-text"),
    ("POST", "/sessions/{s}/messages", b'{"text": "x", "delivery": "later"}', 400, "invalid-delivery"),
    ("POST", "/sessions/{s}/messages", b'{"text": "x", "colour": "red"}', 400, "invalid-body"),
    ("POST", "/sessions/{s}/messages", b'{"text": "x", "id": "a b"}', 400, "invalid-message-id"),
    ("PATCH", "/sessions/{s}/queue/bad%20id", b'{"text": "x"}', 400, "invalid-message-id"),
    ("PATCH", "/sessions/{s}/queue/m1", b'{"txt": "x"}', 400, "invalid-body"),
    ("POST", "/sessions/{s}/cancel", b'{"keep_inbox": "yes"}', 400, "invalid-body"),
    ("GET", "/sessions/{s}/events?protocol=grpc", None, 400, "invalid-protocol"),
    ("GET", "/sessions/{s}/events?after=banana", None, 400, "invalid-last-event-id"),
    ("GET", "/sessions/{s}/events?protocol=kerman&after=3:1", None, 400, "invalid-last-event-id"),
    ("GET", "/nowhere", None, 404, "not-found"),
    ("DELETE", "/sessions", None, 405, "method-not-allowed"),
    ("POST", "/sessions/{s}/messages", b'{"text": "' + b"x" * 70000 + b'"}', 413, "body-too-large"),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), BAD, ids=[f"{b[0]} {b[1][:40]} {b[4]}" for b in BAD])
def test_bad_requests_get_a_clear_json_error(client, method, path, body, status, code):
    session_id = new_session(client)
    response = client.request(
        method, path.replace("{s}", session_id), content=body, headers={"Content-Type": "application/json"} if body is not None else {}
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and len(error["message"]) > 10
    assert "Traceback" not in response.text


def test_a_chunked_body_is_bounded_too(client):
    session_id = new_session(client)

    def chunks():
        for _ in range(100):
            yield b"x" * 1000

    response = client.post(f"/sessions/{session_id}/messages", content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "body-too-large"


def test_duplicate_message_ids_are_refused(client):
    session_id = new_session(client)
    send(client, session_id, "use the tool")
    stream = Stream(client, f"/sessions/{session_id}/events")
    try:
        stream.until(lambda d: d["type"] == "TOOL_CALL_START")
        assert client.post(f"/sessions/{session_id}/messages", json={"text": "x", "id": "m-pending"}).status_code == 201
        dup = client.post(f"/sessions/{session_id}/messages", json={"text": "y", "id": "m-pending", "delivery": "inject"})
        assert dup.status_code == 409 and dup.json()["error"]["code"] == "duplicate-message"
        assert "m-pending" in dup.json()["error"]["message"]
        send(client, session_id, "release", delivery="steer")
        stream.until(run_finished)
    finally:
        stream.close()


def test_no_cors_by_default(client):
    response = client.options("/sessions", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in response.headers
    response = client.get("/sessions", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in response.headers


def test_cors_when_configured(tmp_path):
    with Server(str(tmp_path), "--model", "web_models:factory", "--cors-origin", "http://ui.example") as server, server.client() as c:
        ok = c.options("/sessions", headers={"Origin": "http://ui.example", "Access-Control-Request-Method": "POST"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://ui.example"
        other = c.options("/sessions", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in other.headers


ROUTES = [
    ("GET", "/"),
    ("GET", "/static/chat.js"),
    ("GET", "/sessions"),
    ("POST", "/sessions"),
    ("GET", "/sessions/x"),
    ("GET", "/sessions/x/events"),
    ("POST", "/sessions/x/messages"),
    ("PATCH", "/sessions/x/queue/m"),
    ("DELETE", "/sessions/x/queue/m"),
    ("POST", "/sessions/x/cancel"),
    ("POST", "/sessions/x/fork"),
    ("GET", "/nowhere"),
]


@pytest.mark.parametrize("source", ["flag", "env"])
def test_auth_on_every_route(tmp_path, source):
    args = ("--token", "s3cret") if source == "flag" else ()
    env = {"KERMAN_TOKEN": "s3cret"} if source == "env" else None
    with Server(str(tmp_path), "--model", "web_models:factory", *args, env=env) as server:
        with server.client() as anonymous, server.client(headers={"Authorization": "Bearer wrong"}) as wrong:
            for method, path in ROUTES:
                for c in (anonymous, wrong):
                    response = c.request(method, path)
                    assert response.status_code == 401, (method, path)
                    assert response.json()["error"]["code"] == "unauthorized"
                    assert response.headers["www-authenticate"].startswith("Bearer")
            assert anonymous.get("/?token=wrong").status_code == 401
        with server.client(headers={"Authorization": "Bearer s3cret"}) as c:
            session_id = new_session(c)
            send(c, session_id, "hi")
            stream = Stream(c, f"/sessions/{session_id}/events")
            try:
                stream.until(run_finished)
            finally:
                stream.close()
        with server.client(follow_redirects=False) as browser:  # the chat page trades ?token= for a cookie
            response = browser.get("/?token=s3cret")
            assert response.status_code == 303 and response.headers["location"] == "/"
            cookie = response.headers["set-cookie"]
            port = server.url.rsplit(":", 1)[1]
            assert cookie.startswith(f"kerman_token_{port}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
            assert "s3cret" not in cookie  # a digest: the host's other ports receive the cookie too
            assert browser.get("/").status_code == 200
            assert browser.get(f"/sessions/{session_id}").json()["id"] == session_id


def test_auth_off(client):
    assert client.get("/sessions").status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]


def test_serve_usage_errors(tmp_path):
    import subprocess
    import sys

    def serve(*args):
        return subprocess.run([sys.executable, "-m", "kerman", "serve", *args], capture_output=True, text=True, timeout=60)

    missing = serve(str(tmp_path))
    assert missing.returncode == 2 and "--model module:factory is needed" in missing.stderr
    bad = serve(str(tmp_path), "--model", "no_such_module_here:factory")
    assert bad.returncode == 2 and "cannot import 'no_such_module_here'" in bad.stderr
    shape = serve(str(tmp_path), "--model", "kerman.models")
    assert shape.returncode == 2 and "must look like MODULE:NAME (e.g. kerman.models:EchoModel)" in shape.stderr
    assert "Traceback" not in missing.stderr + bad.stderr + shape.stderr


def test_the_server_stops_on_sigterm(tmp_path):
    server = Server(str(tmp_path), "--model", "web_models:factory")
    with server.client() as c:
        session_id = new_session(c)
        stream = Stream(c, f"/sessions/{session_id}/events")
        try:
            assert server.stop() in (0, -signal.SIGTERM)  # open streams do not keep it up (uvicorn re-raises the signal)
        finally:
            try:
                stream.close()
            except httpx.HTTPError:
                pass


def test_the_web_benchmark_runs():
    """benches/python/web_sse.py (make bench) runs and prints its table; no timing asserted."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[3] / "benches" / "python" / "web_sse.py"
    done = subprocess.run(
        [sys.executable, str(bench), "--clients", "3", "--events", "10", "--pace-ms", "1"], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["stream", "log.tail()", "agui", "kerman"], done.stdout
    figures = json.loads(done.stdout.strip().splitlines()[-1])["web_sse"]
    assert [f["samples"] for f in figures] == [30, 30, 30]
