"""Takeover of a PostgreSQL session between real processes (issue 6): a stale owner is fenced
out, and a SIGKILLed owner's session is taken over with crash closers and nothing it flushed
lost. The other process is ``pg_takeover_child.py``; the two talk over pipes, and waiting for a
lease to lapse polls the database (with a deadline), never a sleep standing in for an event.
A log dropped without ``close()`` in a still-running process frees its session at once. Also
here: a store's connection ended by the server (``pg_terminate_backend``, found by the
store's ``application_name``) is re-established without losing or repeating an append."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import List

import pytest

from conftest import PG_DSN as DSN
from conftest import needs_postgres, psql
from kerman import AgentLoop, PostgresStore, SessionLockedError
from kerman.models import EchoModel

pytestmark = needs_postgres

CHILD = Path(__file__).with_name("pg_takeover_child.py")
TTL = 1.0  # seconds: short, so a takeover after a stall or a kill waits about this long


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def flushed(log):
    await log.flush()


def spawn(mode: str, session_id: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(CHILD), mode, DSN, session_id, str(TTL)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def reap(proc: subprocess.Popen) -> None:
    """Kills the child if it still runs (and was stopped), and closes its pipes."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def line(proc: subprocess.Popen) -> str:
    assert proc.stdout is not None
    got = proc.stdout.readline()
    if not got:
        proc.wait()
        raise AssertionError(f"child exited ({proc.returncode}) early")
    return got.rstrip("\n")


def open_when_free(store: PostgresStore, session_id: str, limit: float = 30.0):
    """Opens the session once its holder's lease has lapsed (polling the database)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return store.open(session_id)
        except SessionLockedError:
            assert time.monotonic() < deadline, "the lease never lapsed"
            time.sleep(0.02)  # pacing the poll, not synchronisation


def data_of(session_id: str) -> List[object]:
    log = PostgresStore(DSN).open(session_id)
    try:
        return [e.data for e in log]
    finally:
        log.close()


def test_a_stale_owner_appends_nothing_after_another_process_takes_over():
    session_id = f"stale-{uuid.uuid4()}"
    proc = spawn("stale", session_id)
    try:
        assert line(proc) == "flush ok"
        assert line(proc) == "ready"
        # Stall the owner (its renewals too) until its lease lapses and we take over.
        os.kill(proc.pid, signal.SIGSTOP)
        taken = open_when_free(PostgresStore(DSN), session_id)
        taken.append("x/e", "b1")
        run(flushed(taken))
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert line(proc) == "flush LeaseLostError"
        assert line(proc) == "append LeaseLostError"
        assert proc.wait(timeout=60) == 0
        taken.append("x/e", "b2")
        run(flushed(taken))
        taken.close()
    finally:
        reap(proc)
    assert data_of(session_id) == ["a0", "a1", "b1", "b2"]


def test_a_log_dropped_without_close_is_free_for_another_process_at_once():
    session_id = f"dropped-{uuid.uuid4()}"
    proc = spawn("drop", session_id)
    try:
        assert line(proc) == "dropped"
        # Its lease lasts 30 s and its store still runs (and renews what it holds): only the
        # release on drop lets us in within the deadline.
        log = open_when_free(PostgresStore(DSN), session_id, limit=15.0)
        assert [e.data for e in log] == ["d0", "d1"], "the dropped log committed what it had queued"
        log.close()
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
    finally:
        reap(proc)


@pytest.mark.parametrize("awaiting", ["model", "tool"])
def test_a_killed_owner_mid_turn_is_taken_over_with_crash_closers(awaiting):
    session_id = f"killed-{awaiting}-{uuid.uuid4()}"
    proc = spawn(awaiting, session_id)
    try:
        head = line(proc)
        assert head.startswith("waiting "), head
        flushed_events = [line(proc) for _ in range(int(head.split()[1]))]
        assert line(proc) == "end"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        reap(proc)
    assert proc.returncode == -signal.SIGKILL

    log = open_when_free(PostgresStore(DSN, lease_ttl=TTL), session_id)
    events = [e.to_json() for e in log]
    n = len(flushed_events)
    assert events[:n] == flushed_events, "an event the dead owner flushed is missing or changed"
    closers = [json.loads(t) for t in events[n:]]
    types = [c["type"] for c in closers]
    if awaiting == "tool":
        assert types == ["tool/result", "step/end", "turn/end"], types
        assert "ToolOutcomeUnknownError" in json.dumps(closers[0]["data"])
    else:
        assert types == ["step/end", "turn/end"], types
    assert closers[-1]["data"]["reason"] == {"kind": "interrupted"}

    # The new owner carries on from there.
    async def another_turn():
        loop = AgentLoop(EchoModel(), log=log)
        loop.followup("after the takeover")
        await loop.when_idle()
        await loop.aclose()
        await log.aclose()

    run(another_turn())
    kinds = [e.type for e in log]
    assert kinds.count("turn/start") == kinds.count("turn/end") == 2


def backend_pid(app: str) -> str:
    out = psql(f"SELECT pid FROM pg_stat_activity WHERE application_name = '{app}'")
    assert len(out) == 1, out
    return out[0]


def test_appends_survive_the_server_ending_the_connection_between_them():
    app = f"kerman-test-{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in DSN else "?"
    store = PostgresStore(f"{DSN}{sep}application_name={app}")
    log = store.create()
    for i in range(3):
        log.append("x/e", i)
    run(flushed(log))
    first = backend_pid(app)
    psql(f"SELECT pg_terminate_backend({first})")
    for i in range(3, 6):
        log.append("x/e", i)
    run(flushed(log))
    assert backend_pid(app) != first
    log.close()
    assert data_of(log.id) == list(range(6))
