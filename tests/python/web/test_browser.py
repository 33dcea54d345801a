"""The web chat in a real headless Chromium (Debian's chromium and chromium-driver, through
selenium): send a prompt and see it stream, reload mid-stream, steer during a tool call, edit
and remove queued messages, cancel, and reload again: the transcript is the log's, with no text
duplicated or missing. Every wait is on a DOM condition, bounded.

Chromium comes from .ci/browser-deps.sh (run by .ci/run); without it the test is skipped,
unless KERMAN_BROWSER_REQUIRED=1 (CI sets it), when it fails."""

from __future__ import annotations

import json
import os
import shutil
import uuid

import pytest
from web_helpers import Server, Stream, kerman_turn_end

pytest.importorskip("starlette")
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

WAIT = 20.0
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def chromium(*flags: str, page_load_timeout: float = WAIT):
    """A headless Chromium through Debian's chromedriver (no driver download), quit at the end:
    skipped without them, failed instead when KERMAN_BROWSER_REQUIRED=1 (CI). A generator, for
    each test module's browser fixture to ``yield from`` with its own flags."""
    if not (CHROMIUM and DRIVER):
        message = "Debian's chromium and chromium-driver are not installed (bash .ci/browser-deps.sh installs them)"
        if os.environ.get("KERMAN_BROWSER_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1200,900", *flags):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(page_load_timeout)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


def wait_for(driver, condition, what):
    def check(d):
        try:
            return condition(d)
        except (StaleElementReferenceException, IndexError, KeyError):
            return False

    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(check, message=f"waiting for {what}")


def bubbles(driver):
    """(role, placement, text) of every message bubble, in order."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#transcript .msg')].map(e => "
        "[e.classList[1], e.dataset.placement || null, e.querySelector('.text').textContent])"
    )


def queue(driver):
    return driver.execute_script(
        "return [...document.querySelectorAll('#queue li')].map(e => [e.dataset.placement, "
        "e.querySelector('.text') ? e.querySelector('.text').textContent : null])"
    )


def send(driver, text, delivery="followup"):
    Select(driver.find_element(By.ID, "delivery")).select_by_value(delivery)
    box = driver.find_element(By.ID, "prompt")
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()
    wait_for(driver, lambda d: d.find_element(By.ID, "prompt").get_attribute("value") == "", f"{text!r} to be sent")


def log_transcript(server, session_id):
    """(role, text) of the session's messages, read from the log over the kerman protocol."""
    with server.client() as client:
        stream = Stream(client, f"/sessions/{session_id}/events?protocol=kerman")
        try:
            events = []
            while True:
                item = stream.next()
                events.append(json.loads(item[1]))
                if (
                    len(events) >= int(client.get(f"/sessions/{session_id}").json()["events"])
                    and kerman_turn_end(events[-1])
                    and client.get(f"/sessions/{session_id}").json()["status"] == "idle"
                ):
                    break
        finally:
            stream.close()
    out = []
    for e in events:
        if e["type"] == "user/message":
            out.append(("user", "".join(b["text"] for b in e["data"]["content"] if b["type"] == "text")))
        elif e["type"] == "assistant/message":
            text = "\n".join(b["text"] for b in e["data"]["message"]["content"] if b["type"] == "text")
            if text:
                out.append(("assistant", text))
    return out


def test_the_chat_page_in_chromium(browser, tmp_path):
    with Server(str(tmp_path), "--model", "web_models:factory") as server:
        session_id = f"chat-{uuid.uuid4().hex[:8]}"
        with server.client() as client:
            assert client.post("/sessions", json={"id": session_id}).status_code == 201
        browser.get(f"{server.url}/#s={session_id}")
        wait_for(browser, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "open", "the stream")

        # a prompt streams; reload in the middle of it
        send(browser, "count 60")
        wait_for(browser, lambda d: " 5 " in bubbles(d)[1][2], "the reply to stream")
        assert bubbles(browser)[1][2] != "".join(f"{i} " for i in range(1, 61))  # still streaming
        browser.refresh()
        full = "".join(f"{i} " for i in range(1, 61))
        wait_for(browser, lambda d: len(bubbles(d)) == 2 and bubbles(d)[1][2] == full, "the whole reply after the reload")
        wait_for(browser, lambda d: d.find_element(By.ID, "status").text == "idle", "the turn to end")
        assert bubbles(browser) == [["user", None, "count 60"], ["assistant", None, full]]

        # a tool call holds the turn; two messages queue behind it; edit one, remove the other
        send(browser, "use the tool")
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".tool[data-call-id]"), "the tool call")
        assert browser.find_element(By.CSS_SELECTOR, ".tool .args").text == '{"why": "testing"}'
        send(browser, "queued A")
        send(browser, "queued B")
        wait_for(browser, lambda d: queue(d) == [["queued", "queued A"], ["queued", "queued B"]], "two queued messages")
        first = browser.find_element(By.CSS_SELECTOR, "#queue li:first-child")
        first.find_element(By.CSS_SELECTOR, "button.edit").click()
        field = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#queue input.edit-text"), "the edit field")
        field.clear()
        field.send_keys("A, edited in the browser")
        browser.find_element(By.CSS_SELECTOR, "#queue button.save").click()
        wait_for(browser, lambda d: queue(d)[0] == ["queued", "A, edited in the browser"], "the edit to show")
        browser.find_element(By.CSS_SELECTOR, "#queue li:nth-child(2) button.remove").click()
        wait_for(browser, lambda d: queue(d) == [["queued", "A, edited in the browser"]], "the removal to show")

        # steer while the tool runs: it enters the next step; then the edited message runs
        send(browser, "keep it short", delivery="steer")
        wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, ".tool .result").text == "held for testing", "the tool result")
        wait_for(browser, lambda d: any(b[2] == "echo: A, edited in the browser" for b in bubbles(d)), "the queued turn")
        wait_for(browser, lambda d: queue(d) == [] and d.find_element(By.ID, "status").text == "idle", "an empty queue")
        steering = [b for b in bubbles(browser) if b[1] == "steering"]
        assert steering == [["user", "steering", "keep it short"]]

        # cancel a turn from the page
        send(browser, "slow")
        wait_for(browser, lambda d: bubbles(d)[-1] == ["assistant", None, "Starting"], "the slow turn")
        browser.find_element(By.ID, "cancel").click()
        wait_for(
            browser,
            lambda d: "turn aborted" in d.find_element(By.CSS_SELECTOR, "#transcript .run-end:last-child").text,
            "the cancelled turn",
        )

        # reload: the transcript is rebuilt from the log, each message once
        shown = bubbles(browser)
        browser.refresh()
        wait_for(browser, lambda d: len(bubbles(d)) == len(shown) and d.find_elements(By.CSS_SELECTOR, ".run-end"), "the replay")
        assert bubbles(browser) == shown
        assert [(role, text) for role, _, text in shown] == log_transcript(server, session_id)
        assert not browser.find_element(By.ID, "error").is_displayed()
        try:
            browser.save_screenshot(str(tmp_path / "chat.png"))
        except WebDriverException:
            pass
