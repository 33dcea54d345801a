"""KermanDurability and calls in doubt: a tool whose body started but whose result was never
logged follows its effect class on resume. A write (book) killed with SIGKILL right after its
effect is not run again: the model gets an outcome-unknown failed result; a read (weather) runs
again; an idempotent tool retries; a reconcile function decides. In process, a death is a
BaseException raised inside the tool right after its effect."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

import pai_agent  # noqa: E402
from pai_agent import PROMPT, build  # noqa: E402

import kerman  # noqa: E402
from conftest import fresh_schema_dsn  # noqa: E402
from kerman.integrations.pydantic_ai import RUN, RUN_END, STARTED, UNIT, InDoubtCall, KermanDurability  # noqa: E402

CHILD = Path(__file__).with_name("pai_agent.py")
EXPECTED = {"city": "Lyon", "weather": "sunny in Lyon", "reference": "BK-LYON-13"}
BOOK = "trip__function_toolset__<agent>.call_tool:book"


def _lines(trace: Path, name: str) -> list[str]:
    path = trace / name
    return path.read_text().splitlines() if path.exists() else []


def _child(kind: str, where: str, trace: Path, kill_in: str = "") -> subprocess.CompletedProcess[str]:
    args = [sys.executable, str(CHILD), kind, where, "s", str(trace), "0"] + ([kill_in] if kill_in else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def _killed_in(kind: str, where: str, tmp_path: Path, tool: str) -> dict:
    trace = tmp_path / "trace"
    trace.mkdir()
    killed = _child(kind, where, trace, tool)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    resumed = _child(kind, where, trace)
    assert resumed.returncode == 0, resumed.stderr
    return {"output": json.loads(resumed.stdout), "trace": trace}


def _types(store: kerman.FileStore) -> list[str]:
    log = store.open("s")
    try:
        return [e.type for e in log.events()]
    finally:
        log.close()


@pytest.mark.timeout(300)
def test_a_write_killed_after_its_effect_is_not_run_again_the_model_hears_outcome_unknown(tmp_path):
    root = tmp_path / "sessions"
    done = _killed_in("file", str(root), tmp_path, "book")
    assert _lines(done["trace"], "book.log") == ["Lyon"]  # once, in the killed process
    assert done["output"]["reference"].startswith("outcome unknown: the call to 'book' started")
    assert _lines(done["trace"], "model.log") == ["0", "1", "2"]
    assert _types(kerman.FileStore(str(root))) == [RUN, UNIT, UNIT, UNIT, STARTED, UNIT, UNIT, RUN_END]
    log = kerman.FileStore(str(root)).open("s")
    try:
        book = [e.data for e in log.events(types=[UNIT]) if e.data["unit"] == BOOK]
    finally:
        log.close()
    assert book[0]["result"]["kind"] == "tool_failed"


@pytest.mark.timeout(300)
def test_a_write_in_doubt_on_postgres(tmp_path):
    done = _killed_in("postgres", fresh_schema_dsn(), tmp_path, "book")
    assert _lines(done["trace"], "book.log") == ["Lyon"]
    assert done["output"]["reference"].startswith("outcome unknown")


@pytest.mark.timeout(300)
def test_a_read_killed_in_its_body_runs_again_and_the_run_ends_as_uninterrupted(tmp_path):
    done = _killed_in("file", str(tmp_path / "sessions"), tmp_path, "weather")
    assert done["output"] == EXPECTED
    assert _lines(done["trace"], "weather.log") == ["Lyon", "Lyon"]
    assert _lines(done["trace"], "book.log") == ["Lyon"]
    # weather is a read: no marker, so only book's call is marked.
    assert _types(kerman.FileStore(str(tmp_path / "sessions"))).count(STARTED) == 1


class _Died(BaseException):
    """Stands for the process dying inside a tool body (a BaseException, so nothing catches it)."""


def _die_once_in(monkeypatch, tool: str) -> None:
    real = pai_agent._trace
    died = []

    def trace_then_die(trace_dir, name, line):
        real(trace_dir, name, line)
        if name == f"{tool}.log" and not died:
            died.append(line)
            raise _Died()

    monkeypatch.setattr(pai_agent, "_trace", trace_then_die)


def _resume_after_death(tmp_path, monkeypatch, **options):
    _die_once_in(monkeypatch, "book")
    store = kerman.MemoryStore()
    first = KermanDurability(store, session_id="s", **options)
    with pytest.raises(_Died):
        asyncio.run(build(tmp_path, [first]).run(PROMPT))
    first.close()
    second = KermanDurability(store, session_id="s", **options)
    output = asyncio.run(build(tmp_path, [second]).run(PROMPT)).output.model_dump()
    types = [e.type for e in second.log.events()]
    second.close()
    return output, types


def test_an_idempotent_tool_in_doubt_runs_again(tmp_path, monkeypatch):
    output, types = _resume_after_death(tmp_path, monkeypatch, effects={"book": "idempotent"})
    assert output == EXPECTED
    assert _lines(tmp_path, "book.log") == ["Lyon", "Lyon"]
    assert STARTED not in types  # retried in doubt: no marker needed


def test_a_reconcile_function_looks_the_outcome_up(tmp_path, monkeypatch):
    seen: list[InDoubtCall] = []

    def reconcile(call: InDoubtCall) -> str:
        seen.append(call)
        return "BK-LYON-13"  # found in the booking system under call.key

    output, types = _resume_after_death(tmp_path, monkeypatch, effects={"book": ("write", reconcile)})
    assert output == EXPECTED
    assert _lines(tmp_path, "book.log") == ["Lyon"]
    assert [(c.tool, c.unit, c.n, c.run) for c in seen] == [("book", BOOK, 0, 1)]
    assert seen[0].key == f"kerman:s:1:{BOOK}:0"
    assert types == [RUN, UNIT, UNIT, UNIT, STARTED, UNIT, UNIT, RUN_END]


def test_a_reconcile_that_finds_nothing_runs_the_body_again(tmp_path, monkeypatch):
    output, _ = _resume_after_death(tmp_path, monkeypatch, effects={"book": ("write", lambda call: None)})
    assert output == EXPECTED
    assert _lines(tmp_path, "book.log") == ["Lyon", "Lyon"]


def test_bad_effects_are_named():
    store = kerman.MemoryStore()
    with pytest.raises(ValueError, match="tool 'book': effect must be one of .* not 'delete'"):
        KermanDurability(store, session_id="s", effects={"book": "delete"})
    with pytest.raises(ValueError, match="tool 'book' is a 'write'.*on_in_doubt='retry' is refused"):
        KermanDurability(store, session_id="s", effects={"book": ("write", "retry")})
    with pytest.raises(ValueError, match="on_in_doubt must be 'retry', 'fail' or a function"):
        KermanDurability(store, session_id="s", effects={"book": ("read", "ask")})
    with pytest.raises(TypeError, match="effects must be a mapping"):
        KermanDurability(store, session_id="s", effects=["book"])  # type: ignore[arg-type]
