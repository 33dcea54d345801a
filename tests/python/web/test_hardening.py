"""kerman serve against hostile and careless clients, over HTTP (a real ``kerman serve`` process).

Writes from another site (a foreign ``Origin``, ``Sec-Fetch-Site: cross-site``, a ``text/plain``
body) are refused and change nothing; a foreign ``Host`` (DNS rebinding) is refused; tokens
with ``+``, ``/`` and ``=`` work in the header, the URL and the cookie; a 30,000-level nested
body is a 400; no answer shows a server path; idle sessions are closed and a session another
process held is owned once it let go; half-sent headers and bodies are cut off; connections and
streams per client are capped; the descriptor limit is raised at start. The browser side of the
cross-site checks is test_browser_attacks.py; a stalled reader's buffered bytes are
test_stalled_reader.py."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from web_helpers import DEADLINE, Server, Stream, run_finished

import kerman

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("sessions")
    with Server(str(root), "--model", "web_models:factory", "--cors-origin", "http://ui.example") as s:
        s.root = root
        yield s


def sessions(client) -> list:
    return [s["id"] for s in client.get("/sessions").json()["sessions"]]


def new_session(client) -> str:
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    assert client.post("/sessions", json={"id": session_id}).status_code == 201
    return session_id


def wait_until(condition, what: str, limit: float = DEADLINE):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.02)  # polling a condition with a bound, not standing in for one
    raise AssertionError(f"timed out waiting for {what}")


def port_of(server) -> int:
    return int(server.url.rsplit(":", 1)[1])


# -- cross-site writes and foreign hosts ------------------------------------------------------------

FOREIGN = [
    {"Origin": "http://evil.example"},
    {"Origin": "null"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # another port of this host
]


@pytest.mark.parametrize("headers", FOREIGN, ids=lambda h: ",".join(f"{k}={v}" for k, v in h.items()))
def test_writes_from_another_site_are_refused_and_change_nothing(server, headers):
    with server.client() as client:
        victim = new_session(client)
        port = port_of(server)
        headers = {k: v.replace("PORT", str(port)) for k, v in headers.items()}
        for method, path, body in (
            ("POST", "/sessions", {"id": "pwned"}),
            ("POST", f"/sessions/{victim}/messages", {"text": "pwned"}),
            ("POST", f"/sessions/{victim}/cancel", {}),
            ("DELETE", f"/sessions/{victim}/queue/m1", None),
        ):
            response = client.request(method, path, content=None if body is None else json.dumps(body), headers={**JSON, **headers})
            assert response.status_code == 403, (method, path, response.text)
            assert response.json()["error"]["code"] == "cross-site"
        embedded = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}  # an <img> or <script> of another site
        assert client.get(f"/sessions/{victim}/events", headers=embedded).status_code == 403
        assert "pwned" not in sessions(client)
        assert client.get(f"/sessions/{victim}").json()["events"] == 0


def test_another_port_of_this_host_is_another_origin(server):
    with server.client() as client:
        other = f"http://127.0.0.1:{port_of(server) + 1}"
        response = client.post("/sessions", json={"id": "pwned-port"}, headers={"Origin": other, "Sec-Fetch-Site": "same-site"})
        assert response.status_code == 403
        assert "pwned-port" not in sessions(client)


def test_a_text_plain_body_is_refused_and_changes_nothing(server):
    with server.client() as client:
        victim = new_session(client)
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
            headers = {"Content-Type": kind} if kind else {}
            response = client.post(f"/sessions/{victim}/messages", content=b'{"text": "pwned"}', headers=headers)
            assert response.status_code == 415, (kind, response.text)
            assert response.json()["error"]["code"] == "not-json"
            assert client.post("/sessions", content=b'{"id": "pwned-plain"}', headers=headers).status_code == 415
        assert "pwned-plain" not in sessions(client)
        assert client.get(f"/sessions/{victim}").json()["events"] == 0


def test_this_servers_own_page_and_configured_origins_may_write(server):
    with server.client() as client:
        own = {"Origin": server.url, "Sec-Fetch-Site": "same-origin"}
        made = client.post("/sessions", json={}, headers=own)
        assert made.status_code == 201, made.text
        session_id = made.json()["id"]
        assert client.post(f"/sessions/{session_id}/messages", json={"text": "hi"}, headers=own).status_code == 201
        configured = {"Origin": "http://ui.example", "Sec-Fetch-Site": "cross-site"}
        assert client.post(f"/sessions/{session_id}/messages", json={"text": "again"}, headers=configured).status_code == 201
        assert client.post(f"/sessions/{session_id}/cancel", headers=own).status_code == 200  # no body: no type needed


@pytest.mark.parametrize("host", ["evil.example", "evil.example:PORT", "localhost.evil.example", "127.0.0.1.nip.io:PORT"])
def test_a_foreign_host_is_refused(server, host):
    """A page on a DNS name rebound to 127.0.0.1 reaches the server with its own name as Host."""
    host = host.replace("PORT", str(port_of(server)))
    with server.client() as client:
        for method, path in (("GET", "/"), ("GET", "/sessions"), ("POST", "/sessions")):
            response = client.request(method, path, headers={"Host": host, **JSON}, content=b"{}" if method == "POST" else None)
            assert response.status_code == 421, (host, method, path)
            assert response.json()["error"]["code"] == "unknown-host" and host in response.json()["error"]["message"]
        for fine in ("127.0.0.1", f"127.0.0.1:{port_of(server)}", f"localhost:{port_of(server)}", "[::1]:80", "LOCALHOST"):
            assert client.get("/sessions", headers={"Host": fine}).status_code == 200, fine


def test_configured_host_names_are_served(tmp_path):
    with Server(str(tmp_path), "--model", "web_models:factory", "--allow-host", "chat.internal") as server, server.client() as client:
        assert client.get("/sessions", headers={"Host": "chat.internal:8000"}).status_code == 200
        assert client.get("/sessions", headers={"Host": "other.internal"}).status_code == 421


# -- tokens the docs allow ---------------------------------------------------------------------------

TOKEN = "q+8/Zr3x==Ab+/"


def test_a_base64_token_works_in_the_header_the_url_and_the_cookie(tmp_path):
    with Server(str(tmp_path), "--model", "web_models:factory", "--token", TOKEN) as server:
        with server.client(headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            assert client.get("/sessions").status_code == 200
        # pasted as is (a browser sends '+' unencoded), and percent-encoded
        for query in (TOKEN, TOKEN.replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")):
            with server.client(follow_redirects=False) as browser:
                response = browser.get(f"/?token={query}")
                assert response.status_code == 303, (query, response.text)
                assert browser.get("/").status_code == 200
                made = browser.post("/sessions", json={}, headers={"Origin": server.url})
                assert made.status_code == 201, made.text
        with server.client(follow_redirects=False) as browser:
            assert browser.get(f"/?token={TOKEN.replace('+', ' ')}x").status_code == 401


def test_a_token_with_spaces_or_controls_is_refused_at_start(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kerman", "serve", str(tmp_path), "--model", "web_models:factory", "--port", "0", "--token", "has space"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )
    assert done.returncode == 2 and "--token" in done.stderr and "' '" in done.stderr and "Traceback" not in done.stderr


# -- bodies --------------------------------------------------------------------------------------------


def test_a_deeply_nested_body_is_a_400(server):
    with server.client() as client:
        session_id = new_session(client)
        for body in (b"[" * 30000 + b"]" * 30000, b'{"a":' * 10000 + b"1" + b"}" * 10000):
            response = client.post(f"/sessions/{session_id}/messages", content=body, headers=JSON)
            assert response.status_code == 400, response.text[:200]
            assert response.json()["error"]["code"] == "invalid-json"


def test_no_answer_shows_a_server_path(server):
    store = Path(server.root)
    (store / "broken.jsonl").write_text("garbage\n")
    (store / "folder.jsonl").mkdir()
    with server.client() as client:
        for session_id in ("broken", "folder"):
            response = client.get(f"/sessions/{session_id}")
            assert 400 <= response.status_code < 500, response.text
            assert str(store) not in response.text and os.path.realpath(store) not in response.text, response.text
            assert "/tmp" not in response.text and "<store>" in response.json()["error"]["message"], response.text


# -- sessions the server holds -------------------------------------------------------------------------


def test_a_session_another_process_held_is_owned_once_it_let_go(tmp_path):
    with Server(str(tmp_path), "--model", "web_models:factory") as server, server.client() as client:
        session_id = new_session(client)
        client.post(f"/sessions/{session_id}/cancel")
    # the server stopped: this process takes the session, then a new server finds it locked
    held = kerman.FileStore(tmp_path).open(session_id)
    with Server(str(tmp_path), "--model", "web_models:factory") as server, server.client() as client:
        assert client.get(f"/sessions/{session_id}").json()["owned"] is False
        refused = client.post(f"/sessions/{session_id}/messages", json={"text": "hello"})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "not-owner"
        held.close()
        sent = client.post(f"/sessions/{session_id}/messages", json={"text": "hello"})
        assert sent.status_code == 201, sent.text
        assert client.get(f"/sessions/{session_id}").json()["owned"] is True
        stream = Stream(client, f"/sessions/{session_id}/events")
        try:
            events = stream.until(run_finished)
        finally:
            stream.close()
        assert any(d.get("delta") == "echo: hello" for _, d in events)


def test_idle_sessions_are_closed(tmp_path):
    with Server(str(tmp_path), "--model", "web_models:factory", "--idle-session", "0.2") as server, server.client() as client:
        session_id = new_session(client)
        stream = Stream(client, f"/sessions/{session_id}/events")
        try:
            assert client.post(f"/sessions/{session_id}/messages", json={"text": "hi"}).status_code == 201
            stream.until(run_finished)
        finally:
            stream.close()

        def free() -> bool:
            try:
                kerman.FileStore(tmp_path).open(session_id).close()
            except kerman.SessionLockedError:
                return False
            return True

        wait_until(free, "the server to close the idle session")
        # the next request opens it again
        assert client.post(f"/sessions/{session_id}/messages", json={"text": "again"}).status_code == 201
        assert client.get(f"/sessions/{session_id}").json()["owned"] is True


def open_session_files(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").endswith(".jsonl")
        except OSError:
            pass
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_open_sessions_are_bounded(tmp_path):
    with (
        Server(str(tmp_path), "--model", "web_models:factory", "--max-sessions", "4", "--idle-session", "0.2") as server,
        server.client() as client,
    ):
        made = []
        for i in range(24):

            def create(i: int = i) -> bool:
                response = client.post("/sessions", json={"id": f"many-{i}"})
                assert response.status_code in (201, 503), response.text
                return response.status_code == 201

            wait_until(create, f"session {i} to be created")  # 503 while the four held are not yet idle
            made.append(f"many-{i}")
            assert open_session_files(server.proc.pid) <= 4
        assert set(made) <= set(sessions(client))


# -- slow and idle connections -------------------------------------------------------------------------


def connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port_of(server)), timeout=DEADLINE)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by DEADLINE)."""
    sock.settimeout(DEADLINE)
    got = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return got
        got += chunk


def test_half_sent_headers_are_cut_off(tmp_path):
    with Server(str(tmp_path), "--model", "web_models:factory", "--header-timeout", "0.3") as server:
        idle = connect(server)  # sends nothing at all
        slow = connect(server)
        slow.sendall(b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        try:
            assert read_all(slow).startswith(b"HTTP/1.1 408")
            assert read_all(idle) == b""
        finally:
            idle.close()
            slow.close()
        with server.client() as client:  # a request sent whole is served as before
            assert client.get("/sessions").status_code == 200


def test_a_half_sent_body_gets_408(tmp_path):
    with Server(str(tmp_path), "--model", "web_models:factory", "--body-timeout", "0.3") as server:
        sock = connect(server)
        try:
            sock.sendall(
                b'POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"id": '
            )
            answer = read_all(sock)
        finally:
            sock.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"body-timeout" in answer


def test_connections_beyond_the_cap_are_refused(tmp_path):
    with (
        Server(str(tmp_path), "--model", "web_models:factory", "--max-connections", "3") as server,
        server.client(limits=__import__("httpx").Limits(max_connections=5)) as client,
    ):
        session_id = new_session(client)
        streams = [Stream(client, f"/sessions/{session_id}/events") for _ in range(3)]  # three held, each answered
        try:
            extra = connect(server)
            try:  # the answer comes at once, before any request (one sent would race the close into a reset)
                answer = read_all(extra)
            finally:
                extra.close()
            assert answer.startswith(b"HTTP/1.1 503") and b"too-many-connections" in answer
        finally:
            for stream in streams:
                stream.close()
        wait_until(lambda: client.get("/sessions").status_code == 200, "a connection slot")


def test_streams_per_client_are_capped(tmp_path):
    with Server(str(tmp_path), "--model", "web_models:factory", "--max-streams", "2") as server, server.client() as client:
        session_id = new_session(client)
        streams = [Stream(client, f"/sessions/{session_id}/events") for _ in range(2)]
        try:
            third = client.get(f"/sessions/{session_id}/events")
            assert third.status_code == 429 and third.json()["error"]["code"] == "too-many-streams"
        finally:
            streams[0].close()
        try:
            again = wait_until(
                lambda: (s := Stream(client, f"/sessions/{session_id}/events")).response.status_code == 200 and s, "a stream slot"
            )
            again.close()
        finally:
            streams[1].close()


@pytest.mark.skipif(not os.path.exists("/proc/self/limits"), reason="reads /proc/<pid>/limits")
def test_the_descriptor_limit_is_raised_at_start(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard limit is {hard}: nothing to raise")

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerman", "serve", str(tmp_path), "--model", "web_models:factory", "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=lower,
        env=env,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "serving" in line, line
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        row = next(r for r in limits.splitlines() if r.startswith("Max open files")).split()
        assert int(row[3]) > 256 and row[3] == row[4], row
    finally:
        proc.terminate()
        proc.wait(timeout=DEADLINE)
        if proc.stderr is not None:
            proc.stderr.close()


# -- without the web extra ------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["starlette", "uvicorn", "sse_starlette"])
def test_serve_without_the_web_extra_says_so_in_one_line(tmp_path, missing):
    code = (
        f"import sys; sys.modules[{missing!r}] = None; from kerman.cli import main; "
        f"raise SystemExit(main(['serve', {str(tmp_path)!r}, '--model', 'kerman.models:EchoModel', '--port', '0']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'kerman[web]'" in lines[0] and missing in lines[0], done.stderr
