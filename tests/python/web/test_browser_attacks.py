"""The web chat's server against pages of other sites, in a real headless Chromium.

An attacker page served from another site (``attacker.test``, resolved to 127.0.0.2) and from
another port of the server's own host (127.0.0.1, where the token cookie is sent too) tries what
a page can do without reading answers: ``no-cors`` fetches with ``text/plain`` bodies, a CORS
fetch, and a ``text/plain`` form post; none creates a session, queues a prompt or cancels a turn.
A page of a DNS name rebound to 127.0.0.1 (``rebound.test``) is refused. A base64-style token
works in the browser, and injected context shows as context. Chromium resolves the test names
itself (``--host-resolver-rules``); every wait is on a condition, bounded."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_browser import WAIT, bubbles, chromium, send, wait_for
from web_helpers import Server

pytest.importorskip("starlette")
webdriver = pytest.importorskip("selenium.webdriver")

from selenium.webdriver.common.by import By  # noqa: E402

RULES = "MAP attacker.test 127.0.0.2, MAP rebound.test 127.0.0.1"


@pytest.fixture(scope="module")
def browser():
    yield from chromium(f"--host-resolver-rules={RULES}")


ATTACK = """<!doctype html><html><head><title>attacking</title></head><body>
<iframe name="sink"></iframe>
<form id="form" method="POST" action="TARGET/sessions" enctype="text/plain" target="sink">
<input name='{"id": "pwned-form", "x": "' value='"}'></form>
<script>
const target = "TARGET", victim = "VICTIM";
const plain = (path, body) => fetch(target + path, {method: "POST", mode: "no-cors", credentials: "include",
                                                     headers: {"Content-Type": "text/plain"}, body});
const attempts = [
  plain("/sessions", JSON.stringify({id: "pwned-fetch"})),
  plain("/sessions/" + victim + "/messages", JSON.stringify({text: "pwned-message"})),
  plain("/sessions/" + victim + "/messages", JSON.stringify({text: "pwned-inject", delivery: "inject"})),
  fetch(target + "/sessions/" + victim + "/cancel", {method: "POST", mode: "no-cors", credentials: "include"}),
  fetch(target + "/sessions", {method: "POST", credentials: "include", headers: {"Content-Type": "application/json"},
                               body: JSON.stringify({id: "pwned-cors"})}),
];
Promise.allSettled(attempts).then(() => {
  document.querySelector("iframe").onload = () => { document.title = "done"; };
  document.getElementById("form").submit();
});
</script></body></html>"""


class AttackerSite:
    """A plain HTTP server on ``host`` serving the attack page at ``/``."""

    def __init__(self, host: str, page: str) -> None:
        body = page.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(WAIT)


def victim_running(client) -> str:
    """A session whose turn is running (the slow model waits), for the attacker to cancel."""
    session_id = f"victim-{uuid.uuid4().hex[:8]}"
    assert client.post("/sessions", json={"id": session_id}).status_code == 201
    assert client.post(f"/sessions/{session_id}/messages", json={"text": "slow"}).status_code == 201
    end = time.monotonic() + WAIT
    while time.monotonic() < end:
        if client.get(f"/sessions/{session_id}").json().get("status") == "running":
            return session_id
        time.sleep(0.01)  # polling the session's status, bounded
    raise AssertionError("the victim's turn did not start")


def attack(browser, server, client, site_host: str, page_host: str) -> None:
    victim = victim_running(client)
    site = AttackerSite(site_host, ATTACK.replace("TARGET", server.url).replace("VICTIM", victim))
    try:
        browser.get(f"http://{page_host}:{site.port}/")
        wait_for(browser, lambda d: d.title == "done", "the attack page to finish")
    finally:
        site.close()
    ids = [s["id"] for s in client.get("/sessions").json()["sessions"]]
    assert not [i for i in ids if i.startswith("pwned")], ids
    info = client.get(f"/sessions/{victim}").json()
    assert info["status"] == "running" and info["queue"] == [], info  # not cancelled, nothing queued
    assert client.post(f"/sessions/{victim}/cancel", json={}).status_code == 200


def test_pages_of_another_site_and_another_port_cannot_write(browser, tmp_path):
    with Server(str(tmp_path), "--model", "web_models:factory") as server, server.client() as client:
        attack(browser, server, client, "127.0.0.2", "attacker.test")  # another site
        attack(browser, server, client, "127.0.0.1", "127.0.0.1")  # another port of the server's host


def test_with_a_token_a_page_on_another_port_gets_nothing_from_the_cookie(browser, tmp_path):
    token = uuid.uuid4().hex
    with (
        Server(str(tmp_path), "--model", "web_models:factory", "--token", token) as server,
        server.client(headers={"Authorization": f"Bearer {token}"}) as client,
    ):
        browser.get(f"{server.url}/?token={token}")  # the user opened the chat: the browser holds the cookie
        wait_for(browser, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "open", "the chat page")
        attack(browser, server, client, "127.0.0.1", "127.0.0.1")
        attack(browser, server, client, "127.0.0.2", "attacker.test")


def test_a_rebound_dns_name_is_refused(browser, tmp_path):
    with Server(str(tmp_path), "--model", "web_models:factory") as server:
        port = server.url.rsplit(":", 1)[1]
        for path in ("/", "/sessions"):
            browser.get(f"http://rebound.test:{port}{path}")
            text = browser.find_element(By.TAG_NAME, "body").text
            assert json.loads(text)["error"]["code"] == "unknown-host", text


def test_a_base64_token_works_in_the_browser_and_context_shows_as_context(browser, tmp_path):
    token = "q+8/Zr3x==Ab+/"
    with Server(str(tmp_path), "--model", "web_models:factory", "--token", token) as server:
        browser.get(f"{server.url}/?token={token}")  # pasted as is
        wait_for(browser, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "open", "the chat page")
        send(browser, "use the tool")
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".tool[data-call-id]"), "the tool call")
        send(browser, "the build is green", delivery="inject")  # the tool returns once input is pending
        wait_for(browser, lambda d: any(b[2] == "the build is green" for b in bubbles(d)), "the context to enter")
        wait_for(browser, lambda d: d.find_element(By.ID, "status").text == "idle", "the turn to end")
        entered = [b for b in bubbles(browser) if b[2] == "the build is green"]
        assert entered == [["user", "context", "the build is green"]]
        assert not browser.find_element(By.ID, "error").is_displayed()
