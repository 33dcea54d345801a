"""The web chat in Chromium: "edit an earlier message and continue from there" (the edit control
on a user message forks the session before it and runs the edited text in the fork, which the
page moves to; the original session is unchanged) and a followup sent while a turn runs with
"roll the turn back" (the turn's messages are shown rolled back, across a reload)."""

from __future__ import annotations

import uuid

import pytest
from test_browser import CHROMIUM, DRIVER, WAIT, browser, bubbles, log_transcript, send, wait_for  # noqa: F401
from web_helpers import Server

pytest.importorskip("starlette")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402


def hash_session(driver) -> str:
    return driver.execute_script("return decodeURIComponent(location.hash.slice(3))")


def rolled_back(driver):
    """(role, text) of every bubble marked rolled back."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#transcript .msg.rolled-back')]"
        ".map(e => [e.classList[1], e.querySelector('.text').textContent])"
    )


def test_edit_an_earlier_message_and_continue_from_there(browser, tmp_path):  # noqa: F811
    with Server(str(tmp_path), "--model", "web_models:factory") as server:
        session_id = f"fork-{uuid.uuid4().hex[:8]}"
        with server.client() as client:
            assert client.post("/sessions", json={"id": session_id}).status_code == 201
        browser.get(f"{server.url}/#s={session_id}")
        wait_for(browser, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "open", "the stream")
        send(browser, "first")
        wait_for(browser, lambda d: bubbles(d)[-1] == ["assistant", None, "echo: first"], "the first reply")
        send(browser, "second")
        wait_for(browser, lambda d: bubbles(d)[-1] == ["assistant", None, "echo: second"], "the second reply")
        wait_for(browser, lambda d: d.find_element(By.ID, "status").text == "idle", "the turn to end")
        original = log_transcript(server, session_id)

        user = browser.find_elements(By.CSS_SELECTOR, "#transcript .msg.user")[1]
        user.find_element(By.CSS_SELECTOR, "button.fork-edit").click()
        field = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#transcript input.fork-text"), "the edit field")
        assert field.get_attribute("value") == "second"
        field.clear()
        field.send_keys("second, edited")
        browser.find_element(By.CSS_SELECTOR, "#transcript button.fork-save").click()

        wait_for(browser, lambda d: hash_session(d) not in ("", session_id), "the page to move to the fork")
        fork_id = hash_session(browser)
        expected = [
            ["user", None, "first"],
            ["assistant", None, "echo: first"],
            ["user", None, "second, edited"],
            ["assistant", None, "echo: second, edited"],
        ]
        wait_for(browser, lambda d: bubbles(d) == expected, "the fork's transcript")
        assert log_transcript(server, fork_id) == [(role, text) for role, _, text in expected]
        assert log_transcript(server, session_id) == original, "the original session is unchanged"
        picker = Select(browser.find_element(By.ID, "session"))
        assert {o.get_attribute("value") for o in picker.options} >= {session_id, fork_id}
        assert not browser.find_element(By.ID, "error").is_displayed()


def test_a_followup_that_rolls_the_running_turn_back(browser, tmp_path):  # noqa: F811
    with Server(str(tmp_path), "--model", "web_models:factory") as server:
        session_id = f"busy-{uuid.uuid4().hex[:8]}"
        with server.client() as client:
            assert client.post("/sessions", json={"id": session_id}).status_code == 201
        browser.get(f"{server.url}/#s={session_id}")
        wait_for(browser, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "open", "the stream")
        send(browser, "slow")
        wait_for(browser, lambda d: bubbles(d)[-1] == ["assistant", None, "Starting"], "the slow turn")
        Select(browser.find_element(By.ID, "on-busy")).select_by_value("rollback")
        send(browser, "instead")
        wait_for(browser, lambda d: bubbles(d)[-1] == ["assistant", None, "echo: instead"], "the followup's reply")
        assert rolled_back(browser) == [["user", "slow"], ["assistant", "Starting"]]
        browser.refresh()
        wait_for(browser, lambda d: len(bubbles(d)) == 4 and rolled_back(d), "the replay")
        assert rolled_back(browser) == [["user", "slow"], ["assistant", "Starting"]]
        assert "rolled back" in browser.find_element(By.CSS_SELECTOR, "#transcript .run-end").text
