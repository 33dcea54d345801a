"""``PostgresStore.resolve`` and ``kerman log resolve`` / ``kerman log in-doubt`` over both
stores (``docs/durability.md#calls-in-doubt``): a process is SIGKILLed inside a tool body (its
``tool/call`` is durable, its result is not), then an operator records the call's one result;
nothing runs. The log is read back through psql, not through Kerman."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, TypeVar

import pytest
from test_in_doubt import executions, killed_mid_call

from conftest import fresh_schema_dsn
from kerman import FileStore, PostgresStore, SessionLockedError

_T = TypeVar("_T")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


def once_free(call: Callable[[], _T], limit: float = 30.0) -> _T:
    """``call()`` once the killed owner's lease has lapsed (polling, with a deadline)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return call()
        except SessionLockedError:
            assert time.monotonic() < deadline, "the dead owner's lease never lapsed"
            time.sleep(0.02)  # pacing the poll, not synchronisation


def records(dsn: str, session: str = "s") -> List[Any]:
    sql = f"SELECT record FROM kerman_events WHERE session_id = '{session}' ORDER BY seq"
    out = subprocess.run(["psql", dsn, "-XAtq", "-c", sql], check=True, capture_output=True, text=True, timeout=30)
    return [json.loads(line) for line in out.stdout.splitlines() if line]


def kerman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kerman", *args], capture_output=True, text=True, timeout=60)


def test_postgres_resolve_records_one_result_and_runs_nothing(tmp_path: Path) -> None:
    dsn, counter = fresh_schema_dsn(), tmp_path / "runs.jsonl"
    killed_mid_call(dsn, counter, "pay")  # write, reconcile: the open leaves the turn open
    store = PostgresStore(dsn)
    with pytest.raises(ValueError, match='call "c9" is not in doubt'):
        once_free(lambda: store.resolve("s", "c9", "nothing"))
    seq = store.resolve("s", "c1", "refunded by hand")
    with pytest.raises(ValueError, match='call "c1" is not in doubt'):
        store.resolve("s", "c1", "again")
    assert [r["tool"] for r in executions(counter)] == ["pay"]
    events = records(dsn)
    [result] = [e for e in events if e["type"] == "tool/result"]
    assert result["seq"] == seq and "error" not in result["data"]
    assert result["data"]["message"]["source"]["callId"] == "c1"
    [call] = [e for e in events if e["type"] == "tool/call"]
    assert result["sourceEventSeqs"] == [call["seq"]]
    # Nothing left for a resume: the turn is closed as the closers close one, and the lease is free.
    assert [e["data"]["reason"]["kind"] for e in events if e["type"] == "turn/end"] == ["interrupted"]
    [row] = store.sessions("s")
    assert row["owner"] is None and row["last_ending"] == "interrupted"


def test_postgres_resolve_is_refused_while_a_live_owner_holds_the_session(tmp_path: Path) -> None:
    dsn, counter = fresh_schema_dsn(), tmp_path / "runs.jsonl"
    killed_mid_call(dsn, counter, "look")
    owner = PostgresStore(dsn)
    log = once_free(lambda: owner.open("s"))
    try:
        before = records(dsn)
        with pytest.raises(SessionLockedError, match='"s"'):
            PostgresStore(dsn).resolve("s", "c1", "looked")
        # ... and one this process holds open: resolve there, with loop.resolve.
        with pytest.raises(SessionLockedError, match="reuse=True"):
            owner.resolve("s", "c1", "looked")
        assert records(dsn) == before
    finally:
        log.close()
    assert PostgresStore(dsn).resolve("s", "c1", "looked", is_error=True) > 0
    [result] = [e for e in records(dsn) if e["type"] == "tool/result"]
    assert result["data"]["error"]["code"] == "TOOL_ERROR"


def test_kerman_log_in_doubt_and_resolve_over_postgres(tmp_path: Path) -> None:
    dsn, counter = fresh_schema_dsn(), tmp_path / "runs.jsonl"
    killed_mid_call(dsn, counter, "put")
    # in-doubt needs no id for a PostgreSQL store either; it reads without taking the lease.
    done = kerman("log", "in-doubt", dsn, "--json")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert (row["session"], row["call_id"], row["name"], row["effect"], row["policy"]) == ("s", "c1", "put", "idempotent", "retry")
    once_free(lambda: PostgresStore(dsn).open("s").close())  # the dead owner's lease has lapsed
    done = kerman("log", "resolve", dsn, "s", "c9", "x")
    assert done.returncode == 1 and 'call "c9" is not in doubt' in done.stderr
    done = kerman("log", "resolve", dsn, "s", "c1", "put by hand")
    assert done.returncode == 0, done.stderr
    assert "resolved call c1" in done.stdout and "nothing ran" in done.stdout
    done = kerman("log", "resolve", dsn, "s", "c1", "put by hand")
    assert done.returncode == 1 and 'call "c1" is not in doubt' in done.stderr
    assert [e["type"] for e in records(dsn)].count("tool/result") == 1
    assert [r["tool"] for r in executions(counter)] == ["put"]
    done = kerman("log", "in-doubt", dsn)
    assert done.returncode == 0 and done.stdout.strip() == "no calls in doubt"


def test_kerman_log_resolve_over_a_file_store(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "runs.jsonl"
    killed_mid_call(root, counter, "book")
    done = kerman("log", "resolve", str(root), "s", "c1", "the booking failed", "--error")
    assert done.returncode == 0, done.stderr
    assert "an error result" in done.stdout
    with FileStore(root).open("s") as log:
        [result] = [e.data for e in log.events() if e.type == "tool/result"]
    assert result["error"]["code"] == "TOOL_ERROR"
    assert [r["tool"] for r in executions(counter)] == ["book"]
