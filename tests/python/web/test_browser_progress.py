"""A running tool call's progress in the web chat, in Chromium: the MCP tool's progress
notifications (``tool/progress``, through the AG-UI stream's ``kerman.tool/progress``) drawn on
its card as a bar with the percentage and the message, the last update kept once the call has
its result, and the same after a reload (rebuilt from the log)."""

from __future__ import annotations

import uuid

import pytest
from test_browser import CHROMIUM, DRIVER, WAIT, browser, send, wait_for  # noqa: F401
from web_helpers import Server

pytest.importorskip("starlette")
pytest.importorskip("mcp")
from selenium.webdriver.common.by import By  # noqa: E402


def progress_of(driver):
    """(callId, percent, value, max, text, done) of each tool card's progress."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#transcript .tool')].map(t => { const p = t.querySelector('.progress');"
        " const bar = p && p.querySelector('progress'); return [t.dataset.callId, p ? p.dataset.percent || null : null,"
        " bar ? bar.value : null, bar ? bar.max : null, p ? p.querySelector('.progress-text').textContent : null,"
        " t.dataset.done === 'true']; })"
    )


def test_an_mcp_tool_s_progress_shows_on_its_call_as_a_bar_with_its_message(browser, tmp_path):  # noqa: F811
    with Server(str(tmp_path), "--model", "web_progress_models:factory") as server:
        session_id = f"progress-{uuid.uuid4().hex[:8]}"
        with server.client() as client:
            assert client.post("/sessions", json={"id": session_id}).status_code == 201
        browser.get(f"{server.url}/#s={session_id}")
        wait_for(browser, lambda d: d.find_element(By.ID, "connection").get_attribute("data-state") == "open", "the stream")

        send(browser, "count")
        wait_for(browser, lambda d: progress_of(d) and progress_of(d)[0][5], "the call's result")
        assert progress_of(browser) == [["p1", "100", 4, 4, "100% step 4", True]]
        # The bar sits on the card above the result.
        order = browser.execute_script("return [...document.querySelector('#transcript .tool').children].map(e => e.className)")
        assert order.index("progress") < order.index("result")

        browser.refresh()  # rebuilt from the log
        wait_for(browser, lambda d: progress_of(d) == [["p1", "100", 4, 4, "100% step 4", True]], "the progress after a reload")
