"""Deciding tool calls from the web chat in a real headless Chromium, while a `kerman worker`
process owns the session over PostgreSQL and a `kerman serve` process only follows and stages
(docs/web.md, "The web chat"). The model (approval_models.py) makes four calls in one step; from
the page, the person approves one, edits the arguments of another (after an invalid JSON the page
refuses to send), denies a third with a reason and answers the question the fourth puts. The log
says the approved and edited calls ran with the decided arguments, the denied one did not run and
the answer became the call's result; the page shows who decided what. A reload in the middle
shows the same pending requests; a second tab sees a decision made in the first, and its own
late submit is refused with the server's reason. Over a file store, the editor from the
keyboard. Every wait is on a DOM condition or on the database, bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from test_browser import bubbles, chromium, send, wait_for
from web_helpers import Server

from conftest import fresh_schema_dsn, needs_postgres

pytest.importorskip("starlette")
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

import kerman  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEADLINE = 30.0


@pytest.fixture(scope="module")
def browser():
    yield from chromium(page_load_timeout=DEADLINE)


def start_worker(dsn: str, runs: Path) -> subprocess.Popen:
    env = {**os.environ, "KERMAN_TEST_RUNS": str(runs), "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "kerman", "worker", dsn, "--app", "approval_models:factory", "--name", "worker-a"]
        + ["--idle-timeout", "600", "--grace", "5"],
        cwd=HERE,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def pending_cards(driver):
    """(tool name, kind) of each decision the page offers, in order."""
    return driver.execute_script("return [...document.querySelectorAll('#decisions .decision')].map(e => [e.dataset.name, e.dataset.kind])")


def card(driver, call_id):
    return driver.find_element(By.CSS_SELECTOR, f'#decisions .decision[data-call-id="{call_id}"]')


def shown_outcome(driver, call_id):
    """What the transcript's tool card says of the call's decision."""
    states = driver.find_elements(By.CSS_SELECTOR, f'#transcript .tool[data-call-id="{call_id}"] .decision-state')
    return states[0].text if states else None


def runs(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@needs_postgres
def test_approve_edit_deny_and_answer_from_the_page_while_a_worker_owns_the_session(browser, tmp_path):
    dsn = fresh_schema_dsn()
    store = kerman.PostgresStore(dsn)  # migrates the fresh schema before the children start
    counter = tmp_path / "runs.jsonl"
    worker = start_worker(dsn, counter)
    try:
        with Server(dsn) as server, server.client() as client:
            session_id = f"chat-{uuid.uuid4().hex[:8]}"
            assert client.post("/sessions", json={"id": session_id}).status_code == 201
            browser.get(f"{server.url}/#s={session_id}")
            wait_for(browser, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "open", "the stream")
            decider = browser.find_element(By.ID, "decider")
            decider.clear()
            decider.send_keys("alice")

            send(browser, "four calls")
            wait_for(browser, lambda d: len(pending_cards(d)) == 4, "four pending decisions")
            assert pending_cards(browser) == [["pay", "approval"]] * 3 + [["colour", "answer"]]
            wait_for(browser, lambda d: d.find_element(By.ID, "status").get_attribute("data-status") == "waiting", "the waiting status")
            assert "4 decisions" in browser.find_element(By.ID, "status").text
            assert "Which colour for the invoice?" in card(browser, "c4-1").text
            assert shown_outcome(browser, "c1-1") == "waiting for a decision"

            # A reload reads the pending requests back from the server; the name is remembered.
            browser.refresh()
            wait_for(browser, lambda d: len(pending_cards(d)) == 4, "the pending decisions after the reload")
            wait_for(browser, lambda d: d.find_element(By.ID, "status").get_attribute("data-status") == "waiting", "waiting again")
            assert browser.find_element(By.ID, "decider").get_attribute("value") == "alice"

            # A second tab on the same session.
            first = browser.current_window_handle
            browser.switch_to.new_window("tab")
            second = browser.current_window_handle
            browser.get(f"{server.url}/#s={session_id}")
            wait_for(browser, lambda d: len(pending_cards(d)) == 4, "the second tab's pending decisions")

            # Approve c1 in the first tab (from the keyboard: the button is focusable and labelled).
            browser.switch_to.window(first)
            approve = card(browser, "c1-1").find_element(By.CSS_SELECTOR, "button.approve")
            assert approve.get_attribute("aria-label") == "Approve pay"
            approve.send_keys(Keys.ENTER)
            wait_for(browser, lambda d: shown_outcome(d, "c1-1") == "approved by alice", "the approval in the first tab")
            browser.switch_to.window(second)
            wait_for(browser, lambda d: shown_outcome(d, "c1-1") == "approved by alice", "the approval in the second tab")
            assert len(pending_cards(browser)) == 3

            # The second tab's stream stalls (as a slow connection would) while the first tab
            # denies c3; the second tab then approves c3 and the server's refusal shows.
            browser.execute_script("state.source.close()")
            browser.switch_to.window(first)
            deny = card(browser, "c3-1")
            deny.find_element(By.CSS_SELECTOR, "input.reason").send_keys("too much")
            deny.find_element(By.CSS_SELECTOR, "button.deny").click()
            wait_for(browser, lambda d: shown_outcome(d, "c3-1") == "denied by alice: too much", "the denial")
            browser.switch_to.window(second)
            card(browser, "c3-1").find_element(By.CSS_SELECTOR, "button.approve").click()
            refusal = wait_for(
                browser, lambda d: card(d, "c3-1").find_element(By.CSS_SELECTOR, ".decision-error").text, "the refusal on the card"
            )
            assert "decided already" in refusal or "resolved" in refusal, refusal
            browser.refresh()  # the reloaded tab shows it as the log has it
            wait_for(browser, lambda d: shown_outcome(d, "c3-1") == "denied by alice: too much", "the denial after the reload")
            browser.close()
            browser.switch_to.window(first)

            # Edit c2: invalid JSON is refused before anything is sent, then a valid edit.
            edit = card(browser, "c2-1")
            edit.find_element(By.CSS_SELECTOR, "button.edit").click()
            editor = wait_for(browser, lambda d: card(d, "c2-1").find_element(By.CSS_SELECTOR, "textarea.arguments"), "the editor")
            assert json.loads(editor.get_attribute("value")) == {"amount": 20}
            editor.clear()
            editor.send_keys('{"amount": 25')
            card(browser, "c2-1").find_element(By.CSS_SELECTOR, "button.send-edit").click()
            message = wait_for(
                browser, lambda d: card(d, "c2-1").find_element(By.CSS_SELECTOR, ".decision-error").text, "the invalid JSON message"
            )
            assert "not valid JSON" in message, message
            assert editor.get_attribute("aria-invalid") == "true"
            assert [d["call_id"] for d in client.get(f"/sessions/{session_id}/decisions").json()["decisions"]] == ["c2-1", "c4-1"]
            editor.send_keys("}")
            card(browser, "c2-1").find_element(By.CSS_SELECTOR, "button.send-edit").click()
            wait_for(browser, lambda d: shown_outcome(d, "c2-1") == 'edited by alice: {"amount":25}', "the edit")

            # Answer c4's question: the step then runs.
            answer = card(browser, "c4-1").find_element(By.CSS_SELECTOR, "textarea.answer")
            answer.send_keys("blue")
            as_json = card(browser, "c4-1").find_element(By.CSS_SELECTOR, "input.answer-json")
            assert not as_json.is_selected()  # the schema asks for a string: sent as text
            as_json.click()  # as JSON, `blue` is no JSON value: refused before anything is sent
            card(browser, "c4-1").find_element(By.CSS_SELECTOR, "button.send-answer").click()
            message = wait_for(
                browser, lambda d: card(d, "c4-1").find_element(By.CSS_SELECTOR, ".decision-error").text, "the invalid answer message"
            )
            assert "The answer is not valid JSON" in message, message
            as_json.click()
            card(browser, "c4-1").find_element(By.CSS_SELECTOR, "button.send-answer").click()
            wait_for(browser, lambda d: shown_outcome(d, "c4-1") == 'answered by alice: "blue"', "the answer")
            wait_for(browser, lambda d: bubbles(d)[-1][2].startswith("results: "), "the model's reply after the results")
            wait_for(browser, lambda d: d.find_element(By.ID, "status").get_attribute("data-status") == "idle", "the turn to end")
            assert pending_cards(browser) == []
            assert not browser.find_element(By.ID, "decisions").is_displayed()
            results = browser.execute_script(
                "return Object.fromEntries([...document.querySelectorAll('#transcript .tool')]"
                ".map(e => [e.dataset.callId, e.querySelector('.result') && e.querySelector('.result').textContent]))"
            )
            assert results["c1-1"] == "paid 10" and results["c2-1"] == "paid 25" and results["c4-1"] == "blue"
            assert "denied" in results["c3-1"] and "too much" in results["c3-1"]

        # The log: the approved and edited calls ran with the decided arguments, once each; the
        # denied one did not run; the answer is the question's result; every decision is alice's.
        events = list(store.follow(session_id).events())
        resolved = {e.data["callId"]: e.data for e in events if e.type == "decision/resolved"}
        assert {c: (r["outcome"], r.get("by")) for c, r in resolved.items()} == {
            "c1-1": ("approved", "alice"),
            "c2-1": ("edited", "alice"),
            "c3-1": ("denied", "alice"),
            "c4-1": ("answered", "alice"),
        }
        assert resolved["c3-1"]["reason"] == "too much" and resolved["c4-1"]["value"] == "blue"
        calls = {e.data["callId"]: json.loads(e.data["arguments"]) for e in events if e.type == "tool/call"}
        assert calls["c1-1"] == {"amount": 10} and calls["c2-1"] == {"amount": 25}
        assert runs(counter) == [{"amount": 10}, {"amount": 25}]  # what the tool's body did: c3 never ran
        answered = [
            e.data["message"]["content"] for e in events if e.type == "tool/result" and e.data["message"]["source"]["callId"] == "c4-1"
        ]
        assert [[block["content"] for block in content] for content in answered] == [[[{"type": "text", "text": "blue"}]]]
        assert store.sessions(session_id)[0]["owner_name"] == "worker-a"  # the web process applied nothing itself
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def test_edit_from_the_keyboard_when_the_server_owns_the_session(browser, tmp_path):
    """Over a file store (`kerman serve` owns the session; served model decision_models.py): the
    editor opens, sends and closes from the keyboard, and the edited call runs once."""
    counter = tmp_path / "runs.jsonl"
    with Server(str(tmp_path / "sessions"), "--model", "decision_models:factory", env={"KERMAN_TEST_RUNS": str(counter)}) as server:
        session_id = f"chat-{uuid.uuid4().hex[:8]}"
        with server.client() as client:
            assert client.post("/sessions", json={"id": session_id}).status_code == 201
        browser.get(f"{server.url}/#s={session_id}")
        wait_for(browser, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "open", "the stream")
        browser.find_element(By.ID, "decider").clear()  # no name: logged as "web"
        send(browser, "pay 5")
        wait_for(browser, lambda d: pending_cards(d) == [["pay", "approval"]], "the pending decision")

        edit = card(browser, "call-1").find_element(By.CSS_SELECTOR, "button.edit")
        edit.send_keys(Keys.ENTER)
        editor = wait_for(
            browser, lambda d: d.switch_to.active_element.get_attribute("class") == "arguments" and d.switch_to.active_element, "focus"
        )
        assert edit.get_attribute("aria-expanded") == "true"
        editor.send_keys(Keys.ESCAPE)  # closes, back on the button
        assert browser.switch_to.active_element == edit and edit.get_attribute("aria-expanded") == "false"
        edit.send_keys(Keys.ENTER)
        editor.clear()
        editor.send_keys('{"amount": 3}', Keys.CONTROL, Keys.ENTER)
        wait_for(browser, lambda d: shown_outcome(d, "call-1") == 'edited by web: {"amount":3}', "the edit")
        wait_for(browser, lambda d: bubbles(d)[-1][2] == "done", "the turn to go on")
        assert runs(counter) == [{"amount": 3}]
        assert not browser.find_element(By.ID, "error").is_displayed()
