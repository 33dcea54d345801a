"""The web chat over a PostgresStore in a real headless Chromium, in the documented deployment:
two `kerman worker` processes own the sessions (one each: `--max-sessions 1`) and a `kerman
serve` process only follows and stages. From the page, in each worker's session: a queued
message is edited and another removed, and the running turn is cancelled; the owning worker
applies each and the page shows it, with no error. Every wait is on a DOM condition or on
database state, bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from test_browser import bubbles, chromium, queue, send, wait_for
from web_helpers import Server

from conftest import fresh_schema_dsn, needs_postgres

pytestmark = needs_postgres
pytest.importorskip("starlette")
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402

import kerman  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEADLINE = 30.0


@pytest.fixture(scope="module")
def browser():
    yield from chromium(page_load_timeout=DEADLINE)


def click(driver, selector):
    wait_for(driver, lambda d: d.find_element(By.CSS_SELECTOR, selector).click() or True, f"a click on {selector}")


def start_worker(dsn: str, name: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kerman",
            "worker",
            dsn,
            "--app",
            "web_models:factory",
            "--name",
            name,
            "--max-sessions",
            "1",
            "--idle-timeout",
            "600",
            "--grace",
            "5",
        ],
        cwd=HERE,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def owner_of(store: kerman.PostgresStore, session_id: str, workers: set) -> str:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        name = store.sessions(session_id)[0]["owner_name"]
        if name in workers:
            return name
        time.sleep(0.05)
    raise AssertionError(f"no worker took session {session_id!r}")


def test_cancel_edit_and_remove_from_the_page_reach_the_owning_worker(browser):
    dsn = fresh_schema_dsn()
    store = kerman.PostgresStore(dsn)  # migrates the fresh schema before the children start
    workers = [start_worker(dsn, "worker-a"), start_worker(dsn, "worker-b")]
    try:
        with Server(dsn) as server, server.client() as client:
            sessions = [f"chat-{uuid.uuid4().hex[:8]}" for _ in range(2)]
            owners = []
            for session_id in sessions:
                assert client.post("/sessions", json={"id": session_id}).status_code == 201
                assert client.post(f"/sessions/{session_id}/messages", json={"text": "hello"}).status_code == 201
                owners.append(owner_of(store, session_id, {"worker-a", "worker-b"}))
            assert sorted(owners) == ["worker-a", "worker-b"]  # one session per worker

            for session_id in sessions:
                browser.get(f"{server.url}/#s={session_id}")
                wait_for(browser, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "open", "the stream")
                wait_for(browser, lambda d: ["assistant", None, "echo: hello"] in bubbles(d), "the first reply")

                send(browser, "slow")
                wait_for(browser, lambda d: bubbles(d)[-1] == ["assistant", None, "Starting"], "the slow turn")
                send(browser, "queued A")
                send(browser, "queued B")
                wait_for(browser, lambda d: queue(d) == [["queued", "queued A"], ["queued", "queued B"]], "two queued messages")

                # The queue is re-rendered as events arrive: a button found just before a render is
                # stale, so each click is retried until it lands on the current element.
                click(browser, "#queue li:first-child button.edit")
                field = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#queue input.edit-text"), "the edit field")
                field.clear()
                field.send_keys("A, edited in the browser")
                click(browser, "#queue button.save")
                wait_for(
                    browser, lambda d: queue(d) == [["queued", "A, edited in the browser"], ["queued", "queued B"]], "the edit to show"
                )
                click(browser, "#queue li:nth-child(2) button.remove")
                wait_for(browser, lambda d: queue(d) == [["queued", "A, edited in the browser"]], "the removal to show")

                assert browser.find_element(By.ID, "keep-inbox").is_selected()
                browser.find_element(By.ID, "cancel").click()
                wait_for(
                    browser,
                    lambda d: any("turn aborted" in e.text for e in d.find_elements(By.CSS_SELECTOR, "#transcript .run-end")),
                    "the cancelled turn",
                )
                # A worker runs the input a cancel kept: the edited message is the next turn; the
                # removed one never runs.
                wait_for(browser, lambda d: bubbles(d)[-1] == ["assistant", None, "echo: A, edited in the browser"], "the kept turn")
                wait_for(browser, lambda d: queue(d) == [] and d.find_element(By.ID, "status").text == "idle", "an empty queue")
                texts = [text for _, _, text in bubbles(browser)]
                assert texts == ["hello", "echo: hello", "slow", "Starting", "A, edited in the browser", "echo: A, edited in the browser"]
                assert not browser.find_element(By.ID, "error").is_displayed(), browser.find_element(By.ID, "error").text

            # A refusal reaches the page with the owner's reason: a message removed (by another
            # client) while its edit was open is no longer queued.
            send(browser, "slow")
            wait_for(browser, lambda d: bubbles(d)[-1] == ["assistant", None, "Starting"], "another slow turn")
            send(browser, "queued C")
            wait_for(browser, lambda d: queue(d) == [["queued", "queued C"]], "one queued message")
            message_id = browser.find_element(By.CSS_SELECTOR, "#queue li").get_attribute("data-id")
            click(browser, "#queue li:first-child button.edit")
            field = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#queue input.edit-text"), "the edit field")
            assert client.delete(f"/sessions/{sessions[-1]}/queue/{message_id}").status_code == 200
            field.send_keys(" (too late)")
            click(browser, "#queue button.save")
            wait_for(browser, lambda d: "no longer queued" in d.find_element(By.ID, "error").text, "the refusal")
            assert message_id in browser.find_element(By.ID, "error").text
            browser.find_element(By.ID, "keep-inbox").click()  # untick: discard the queue
            browser.find_element(By.ID, "cancel").click()
            wait_for(
                browser,
                lambda d: bubbles(d)[-1] == ["assistant", None, "Starting"] and d.find_element(By.ID, "status").text == "idle",
                "the second cancelled turn",
            )
            assert queue(browser) == []

            # Still owned by the same workers: the web process applied nothing itself.
            assert [store.sessions(s)[0]["owner_name"] for s in sessions] == owners
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
