"""Calls in doubt where a user looks (issue 28, item 6): the worker's INFO line for each
takeover, ``kerman worker --log-level``, ``kerman sessions`` (last ending, ``--attention``),
``kerman log show`` and the notebook reprs."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List

import pytest
from in_doubt_tools import build
from test_in_doubt import killed_mid_call, resume

from conftest import fresh_schema_dsn
from kerman import AgentLoop, FileStore, ModelReply, PostgresStore, ToolResult, Worker
from kerman.models import EchoModel

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


def kerman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kerman", *args], capture_output=True, text=True, timeout=60)


def run_worker_until_released(dsn: str, counter: Path) -> None:
    """A Worker in this process takes session "s" (its dead owner's lease lapses), runs it and
    lets it go; then it stops."""

    async def model(request: Any) -> ModelReply:
        return ModelReply("answered")

    async def main() -> None:
        taken = asyncio.Event()

        def factory(log: Any) -> AgentLoop:
            taken.set()
            return build(model, log, str(counter))

        worker = Worker(PostgresStore(dsn, lease_ttl=1.0), factory, idle_timeout=0.2, sweep_interval=0.1)
        serving = asyncio.ensure_future(worker.run())
        try:
            await asyncio.wait_for(taken.wait(), 30)
            while "s" in worker.sessions:
                await asyncio.sleep(0.02)  # pacing a poll of the worker's sessions (a release has no event)
        finally:
            worker.stop()
            await serving

    asyncio.run(asyncio.wait_for(main(), 60))


def takeover_lines(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kerman.worker" and "took over" in r.getMessage()]


def test_the_worker_logs_a_takeover_with_each_call_in_doubt_and_its_policy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dsn, counter = fresh_schema_dsn(), tmp_path / "runs.jsonl"
    killed_mid_call(dsn, counter, "look")  # read, retry: the new owner runs it again
    with caplog.at_level(logging.INFO, logger="kerman.worker"):
        run_worker_until_released(dsn, counter)
    [line] = takeover_lines(caplog)
    assert "took over session 's'" in line and "its last turn was left open" in line
    assert "call c1 look in doubt: retry -> runs again with the same key" in line
    assert [r.levelno for r in caplog.records if "took over" in r.getMessage()] == [logging.INFO]


def test_the_worker_logs_a_call_the_closers_failed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dsn, counter = fresh_schema_dsn(), tmp_path / "runs.jsonl"
    killed_mid_call(dsn, counter, "send")  # write, fail: the take's closers fail it
    with caplog.at_level(logging.INFO, logger="kerman.worker"):
        run_worker_until_released(dsn, counter)
    [line] = takeover_lines(caplog)
    assert "turn 1 was interrupted" in line
    assert "call c1 send (write) in doubt: fail -> closed as TOOL_OUTCOME_UNKNOWN" in line


def test_a_plain_take_logs_no_takeover(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    store.create("s").close()
    store.enqueue("s", "hello")

    async def main() -> None:
        taken = asyncio.Event()

        def factory(log: Any) -> AgentLoop:
            taken.set()
            return AgentLoop(EchoModel(), log=log)

        worker = Worker(PostgresStore(dsn), factory, idle_timeout=0.2, sweep_interval=0.1)
        serving = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(taken.wait(), 30)
        while "s" in worker.sessions:
            await asyncio.sleep(0.02)  # pacing a poll (a release has no event)
        worker.stop()
        await serving

    with caplog.at_level(logging.INFO, logger="kerman.worker"):
        asyncio.run(asyncio.wait_for(main(), 60))
    assert takeover_lines(caplog) == []


def test_kerman_worker_refuses_a_bad_log_level() -> None:
    done = kerman("worker", "postgresql://nowhere/db", "--app", "x:y", "--log-level", "chatty")
    assert done.returncode == 2
    assert "--log-level" in done.stderr and "'chatty'" in done.stderr


def test_kerman_sessions_shows_the_last_ending_and_lists_what_needs_attention(tmp_path: Path) -> None:
    dsn, counter = fresh_schema_dsn(), tmp_path / "runs.jsonl"
    killed_mid_call(dsn, counter, "send")  # session "s": its turn left open by a dead owner
    store = PostgresStore(dsn)
    with store.create("fine") as log:
        loop = AgentLoop(EchoModel(), log=log)

        async def one_turn() -> None:
            loop.followup("hi")
            await loop.when_idle()
            await loop.aclose()

        asyncio.run(one_turn())
    store.create("new").close()
    deadline = time.monotonic() + 30
    while not (row := store.sessions("s")[0])["expires_at"] < row["now"]:  # the dead owner's lease lapses
        assert time.monotonic() < deadline, row
        time.sleep(0.02)  # pacing the poll, not synchronisation
    done = kerman("sessions", dsn, "list", "--json")
    assert done.returncode == 0, done.stderr
    endings = {r["id"]: r["last_ending"] for r in json.loads(done.stdout)}
    assert endings == {"fine": "completed", "new": None, "s": "open"}
    done = kerman("sessions", dsn, "list", "--attention", "--json")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert row["id"] == "s" and row["in_doubt"] == 1
    done = kerman("sessions", dsn)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert "LAST ENDING" in lines["SESSION"] and "IN DOUBT" not in lines["SESSION"]
    assert "completed" in lines["fine"] and "open (interrupted)" in lines["s"]
    done = kerman("sessions", dsn, "list", "--attention")
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    assert header.split()[-2:] == ["IN", "DOUBT"] and row.split()[0] == "s" and row.split()[-1] == "1"
    done = kerman("sessions", dsn, "show", "s")
    assert done.returncode == 0, done.stderr
    assert "in doubt:       1" in done.stdout


def test_kerman_log_show_marks_calls_in_doubt(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "send")
    done = kerman("log", "show", str(root), "s")
    assert done.returncode == 0, done.stderr
    [mark] = [line for line in done.stdout.splitlines() if "IN DOUBT" in line]
    assert mark.lstrip().startswith("! IN DOUBT: call #c1 (write, on_in_doubt=fail) has no result")
    # The next open closes it as the policy says: the result is marked as an unknown outcome.
    resume(root, counter)
    done = kerman("log", "show", str(root), "s")
    assert done.returncode == 0, done.stderr
    assert "IN DOUBT" not in done.stdout
    [mark] = [line for line in done.stdout.splitlines() if "OUTCOME UNKNOWN" in line]
    assert "call #c1 was in doubt" in mark
    # --json stays the records exactly as stored.
    done = kerman("log", "show", str(root), "s", "--json")
    assert "OUTCOME UNKNOWN" not in done.stdout


def test_notebook_reprs_mark_calls_in_doubt(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "put")  # idempotent, retry: the turn stays open on open

    async def main() -> None:
        with FileStore(root).open("s") as log:
            html = log._repr_html_()
            assert "1 call(s) in doubt (no result)" in html
            assert "IN DOUBT: call #c1 (idempotent, on_in_doubt=retry)" in html
            loop = build(lambda request: ModelReply("unused"), log, str(counter))
            html = loop._repr_html_()
            assert "in doubt</th>" in html and "<code>put</code>" in html and "on_in_doubt=retry" in html
            loop.resolve("c1", ToolResult("put failed", is_error=True))
            assert "in doubt</th>" not in loop._repr_html_()
            assert 'class="k-doubt"' not in log._repr_html_()
            await loop.aclose()

    asyncio.run(main())
