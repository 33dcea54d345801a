"""Usage in the web chat, in Chromium: a line under each ended turn and the session's total in
the header, read from the usage ledger (``GET /sessions/{id}/usage``), the same after a reload;
a turn the session's budget stopped says so."""

from __future__ import annotations

import uuid

import pytest
from test_browser import CHROMIUM, DRIVER, WAIT, browser, bubbles, send, wait_for  # noqa: F401
from web_helpers import Server

pytest.importorskip("starlette")
from selenium.webdriver.common.by import By  # noqa: E402


def usage_lines(driver):
    """(turn, tokens, text) of every usage line, in transcript order."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#transcript .usage')].map(e => [Number(e.dataset.turn), "
        "e.dataset.tokens === undefined ? null : Number(e.dataset.tokens), e.textContent])"
    )


def total(driver):
    el = driver.find_element(By.ID, "usage-total")
    return el.get_attribute("data-tokens"), el.text


ONE = "1 requests, 60 in + 40 cache read + 0 cache write, 20 out (0 reasoning), 0 tool calls"


def test_each_turns_usage_shows_under_its_reply_and_the_session_total_in_the_header(browser, tmp_path):  # noqa: F811
    with Server(str(tmp_path), "--model", "web_usage_models:factory") as server:
        session_id = f"usage-{uuid.uuid4().hex[:8]}"
        with server.client() as client:
            assert client.post("/sessions", json={"id": session_id}).status_code == 201
        browser.get(f"{server.url}/#s={session_id}")
        wait_for(browser, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "open", "the stream")

        send(browser, "one")
        wait_for(browser, lambda d: [line[:2] for line in usage_lines(d)] == [[1, 120]], "turn 1's usage")
        assert usage_lines(browser)[0][2].startswith(f"turn 1: {ONE}")
        # Under the reply: the line follows the turn's last bubble.
        order = browser.execute_script("return [...document.querySelectorAll('#transcript > *')].map(e => e.className)")
        assert order == ["msg user", "msg assistant", "usage"]

        send(browser, "two")
        wait_for(browser, lambda d: [line[:2] for line in usage_lines(d)] == [[1, 120], [2, 120]], "turn 2's usage")
        wait_for(browser, lambda d: total(d)[0] == "240", "the session's total")
        assert total(browser)[1].startswith("session: 2 requests, 120 in + 80 cache read")

        # The budget allows 2 requests per session: the third prompt is stopped at its claim.
        send(browser, "three")
        wait_for(browser, lambda d: len(usage_lines(d)) == 3 and usage_lines(d)[2][1] == 0, "turn 3's (empty) usage")
        ends = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#transcript .run-end.error")]
        assert ends == ["turn failed: the turn's budget is spent: requests 2 of 2 per session, when input was claimed [BUDGET]"]

        browser.refresh()  # rebuilt from the log
        wait_for(
            browser,
            lambda d: [line[:2] for line in usage_lines(d)] == [[1, 120], [2, 120], [3, 0]] and total(d)[0] == "240",
            "the usage after a reload",
        )
        assert [b[2] for b in bubbles(browser)] == ["one", "echo: one", "two", "echo: two"]
        with server.client() as client:
            usage = client.get(f"/sessions/{session_id}/usage").json()
        assert usage["session"]["requests"] == 2 and usage["session"]["cacheRead"] == 80
        assert [(t["turn"], t["tokens"]) for t in usage["turns"]] == [(1, 120), (2, 120), (3, 0)]
