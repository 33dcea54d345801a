"""A prompt cancelled between its claim and its entry, in the web chat in Chromium: it is no
longer queued (claimed input never returns by itself) but it is never hidden: the transcript
shows it as cancelled before it was read, with a resend button (``requeue_claimed``), across
reloads."""

from __future__ import annotations

import uuid

import pytest
from test_browser import CHROMIUM, DRIVER, WAIT, browser, bubbles, queue, send, wait_for  # noqa: F401
from web_helpers import Server

pytest.importorskip("starlette")
from selenium.webdriver.common.by import By  # noqa: E402


def unread(driver):
    """(text, note, resent, has a resend button) of every unread card."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#transcript .unread')].map(e => [e.querySelector('.text').textContent, "
        "e.querySelector('.note').textContent, e.dataset.resent === 'true', !!e.querySelector('button.resend')])"
    )


def test_a_prompt_cancelled_before_it_was_read_shows_with_a_resend_button(browser, tmp_path):  # noqa: F811
    with Server(str(tmp_path), "--model", "web_gated_models:factory") as server:
        session_id = f"unread-{uuid.uuid4().hex[:8]}"
        with server.client() as client:
            assert client.post("/sessions", json={"id": session_id}).status_code == 201
        browser.get(f"{server.url}/#s={session_id}")
        wait_for(browser, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "open", "the stream")

        send(browser, "wait at the door")
        wait_for(browser, lambda d: d.find_element(By.ID, "status").text == "running" and queue(d) == [], "the claim")
        keep = browser.find_element(By.ID, "keep-inbox")
        if not keep.is_selected():
            keep.click()
        browser.find_element(By.ID, "cancel").click()
        cancelled = [["wait at the door", "cancelled before it was read", False, True]]
        wait_for(browser, lambda d: unread(d) == cancelled, "the unread prompt")
        assert queue(browser) == [] and all(b[2] != "wait at the door" for b in bubbles(browser))

        browser.refresh()  # rebuilt from the log: still shown
        wait_for(browser, lambda d: unread(d) == cancelled, "the unread prompt after a reload")

        browser.find_element(By.CSS_SELECTOR, ".unread button.resend").click()
        done = [["user", None, "wait at the door"], ["assistant", None, "echo: wait at the door"]]
        wait_for(browser, lambda d: bubbles(d) == done, "the prompt sent again to run")
        wait_for(browser, lambda d: unread(d) == [["wait at the door", "sent again", True, False]], "the card marked")

        browser.refresh()
        wait_for(
            browser,
            lambda d: bubbles(d) == done and unread(d) == [["wait at the door", "sent again", True, False]],
            "the same after a reload",
        )
        with server.client() as client:
            assert client.post(f"/sessions/{session_id}/requeue", json={"turn": 1}).status_code == 409
            assert client.post(f"/sessions/{session_id}/requeue", json={"turn": "1"}).status_code == 400
