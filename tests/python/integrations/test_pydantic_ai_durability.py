"""KermanDurability: a pydantic-ai Agent (FunctionModel, two tools, structured output) journalled
in a Kerman session. A child process SIGKILLed right after each unit result is durable
(``sync="units"``), then run again on the same session, ends with the uninterrupted run's output,
executes no tool twice and requests no logged model response again (FileStore and
PostgresStore); with ``sync="effects"``, a kill right after a waited unit keeps the units before
it that were not waited for, and a kill right after one not waited for loses nothing either (the
session is written through); in process: the event types, a second run in a finished session, a
resume with another prompt refused."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from pai_agent import PROMPT, build  # noqa: E402
from pydantic_ai.exceptions import UserError  # noqa: E402

import kerman  # noqa: E402
from conftest import fresh_schema_dsn  # noqa: E402
from kerman.integrations.pydantic_ai import RAISED, RUN, RUN_END, STARTED, UNIT, KermanDurability  # noqa: E402

CHILD = Path(__file__).with_name("pai_agent.py")
UNITS = 5  # model, weather, model, book, model
EXPECTED = {"city": "Lyon", "weather": "sunny in Lyon", "reference": "BK-LYON-13"}


def _lines(trace: Path, name: str) -> list[str]:
    path = trace / name
    return path.read_text().splitlines() if path.exists() else []


def _child(kind: str, where: str, session: str, trace: Path, kill_after: int, sync: str = "units") -> subprocess.CompletedProcess[str]:
    args = [sys.executable, str(CHILD), kind, where, session, str(trace), str(kill_after), "", sync]
    return subprocess.run(args, capture_output=True, text=True, timeout=90)


def _kill_at_every_boundary(kind: str, where: str, tmp_path: Path) -> None:
    """One session, one process per unit (``sync="units"``): each process replays what the ones
    before it logged, logs one unit more and is killed right after it is durable, so the kills
    land after unit 1, 2, ... UNITS; a last process finishes the run."""
    trace = tmp_path / "trace"
    trace.mkdir()
    for k in range(1, UNITS + 1):
        killed = _child(kind, where, "s", trace, 1)
        assert killed.returncode == -signal.SIGKILL, (k, killed.returncode, killed.stderr)
        assert killed.stdout == ""
        ran = len(_lines(trace, "model.log")) + len(_lines(trace, "weather.log")) + len(_lines(trace, "book.log"))
        assert ran == k, f"{ran} unit bodies ran after {k} kills (each after one unit)"
    resumed = _child(kind, where, "s", trace, 0)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == EXPECTED
    assert _lines(trace, "weather.log") == ["Lyon"]
    assert _lines(trace, "book.log") == ["Lyon"]
    # Each model request ran once: the logged ones were not requested again after a kill.
    assert _lines(trace, "model.log") == ["0", "1", "2"]


@pytest.mark.timeout(900)  # seven processes importing pydantic-ai
def test_a_file_session_killed_after_each_unit_finishes_as_uninterrupted(tmp_path):
    _kill_at_every_boundary("file", str(tmp_path / "sessions"), tmp_path)


@pytest.mark.timeout(900)
def test_a_postgres_session_killed_after_each_unit_finishes_as_uninterrupted(tmp_path):
    _kill_at_every_boundary("postgres", fresh_schema_dsn(), tmp_path)


def _killed_after(unit: int, tmp_path: Path) -> dict[str, list[str]]:
    """A file session's run (``sync="effects"``) killed right after its ``unit``-th unit is
    appended, then finished by a second process: what ran, in both."""
    trace = tmp_path / "trace"
    trace.mkdir()
    where = str(tmp_path / "sessions")
    killed = _child("file", where, "s", trace, unit, sync="effects")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    resumed = _child("file", where, "s", trace, 0, sync="effects")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == EXPECTED
    return {name: _lines(trace, f"{name}.log") for name in ("model", "weather", "book")}


@pytest.mark.timeout(300)
def test_a_kill_after_a_waited_unit_keeps_the_units_before_it_not_waited_for(tmp_path):
    # The fourth unit is book's result (a write: its marker and its result are flushed). The
    # model responses and weather's result before it were not waited for, but the marker's
    # flush made them durable (the log is written in order): none is requested or run again.
    ran = _killed_after(4, tmp_path)
    assert ran == {"model": ["0", "1", "2"], "weather": ["Lyon"], "book": ["Lyon"]}


@pytest.mark.parametrize("unit", [1, 2, 3])
@pytest.mark.timeout(300)
def test_a_kill_after_a_unit_not_waited_for_loses_nothing(unit, tmp_path):
    # Units 1-3 (a model response, weather's result, a model response) are not waited for. The
    # session is written through: each is in the file when its append returns, so the process
    # killed right after it loses none, and the next attempt requests no logged model response
    # again and runs no logged read again.
    ran = _killed_after(unit, tmp_path)
    assert ran == {"model": ["0", "1", "2"], "weather": ["Lyon"], "book": ["Lyon"]}


@pytest.mark.timeout(300)
def test_the_uninterrupted_child_logs_one_unit_per_model_request_and_tool_call(tmp_path):
    trace = tmp_path / "trace"
    trace.mkdir()
    done = _child("file", str(tmp_path / "sessions"), "s", trace, 0)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == EXPECTED
    log = kerman.FileStore(str(tmp_path / "sessions")).open("s")
    try:
        types = [e.type for e in log.events()]
        units = [e.data["unit"] for e in log.events(types=[UNIT])]
    finally:
        log.close()
    # book is a write: marked started before its body runs (weather, a read, is not).
    assert types == [RUN, UNIT, UNIT, UNIT, STARTED, UNIT, UNIT, RUN_END]
    assert units == [
        "trip__model.request",
        "trip__function_toolset__<agent>.call_tool:weather",
        "trip__model.request",
        "trip__function_toolset__<agent>.call_tool:book",
        "trip__model.request",
    ]


def _run(agent, prompt: str = PROMPT):
    return asyncio.run(agent.run(prompt))


def test_a_finished_run_is_not_replayed_the_next_run_is_a_new_one(tmp_path):
    store = kerman.MemoryStore()
    durability = KermanDurability(store, session_id="s")
    agent = build(tmp_path, [durability])
    assert _run(agent).output.model_dump() == EXPECTED
    assert _run(agent).output.model_dump() == EXPECTED
    assert len(_lines(tmp_path, "book.log")) == 2  # the second run is a run of its own
    runs = [e.data["run"] for e in durability.log.events(types=[RUN])]
    ends = [e.data for e in durability.log.events(types=[RUN_END])]
    assert runs == [1, 2]
    assert ends == [{"run": 1, "output": EXPECTED}, {"run": 2, "output": EXPECTED}]
    durability.close()


def test_an_interrupted_run_resumed_with_another_prompt_is_refused(tmp_path):
    store = kerman.MemoryStore()
    log = store.create("s")
    log.append(RUN, {"run": 1, "agent": "trip", "prompt": PROMPT})
    log.close()
    durability = KermanDurability(store, session_id="s")
    with pytest.raises(UserError, match="interrupted, started with prompt 'Plan a trip to Lyon and book it.'"):
        _run(build(tmp_path, [durability]), "Something else")
    assert _lines(tmp_path, "model.log") == []
    durability.close()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="session_id must be a non-empty string, not ''"):
        KermanDurability(kerman.MemoryStore(), session_id="")
    with pytest.raises(TypeError, match="store must be a Kerman store"):
        KermanDurability("sessions/", session_id="s")  # type: ignore[arg-type]
    assert repr(KermanDurability(kerman.MemoryStore(), session_id="s")) == "KermanDurability(session_id='s', name=None, sync='effects')"
    with pytest.raises(ValueError, match='sync must be "effects" or "units", not \'unit\''):
        KermanDurability(kerman.MemoryStore(), session_id="s", sync="unit")  # type: ignore[arg-type]


def test_a_file_session_is_written_through_and_the_default_sync_follows_the_store(tmp_path):
    store = kerman.FileStore(str(tmp_path / "sessions"))
    durability = KermanDurability(store, session_id="s")
    assert durability.sync == "effects"
    assert _run(build(tmp_path, [durability])).output.model_dump() == EXPECTED
    assert durability.log.write_through is True
    assert repr(durability.log).endswith(" open write-through>")
    durability.close()
    # The other stores have no such choice; PostgreSQL's default waits for every unit.
    log = kerman.MemoryStore().create("m")
    with pytest.raises(ValueError, match="write_through applies to FileStore sessions"):
        log.write_through = True
    assert log.write_through is False
    log.close()


def test_the_session_is_an_ordinary_session_for_log_show_and_the_notebook(tmp_path, capsys):
    from kerman import cli

    root = tmp_path / "sessions"
    durability = KermanDurability(kerman.FileStore(str(root)), session_id="s")
    _run(build(tmp_path, [durability]))
    html = durability.log._repr_html_()
    durability.close()
    assert "pydantic-ai/unit" in html and "pydantic-ai/run-end" in html
    capsys.readouterr()
    assert cli.main(["log", "show", str(root), "s"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.startswith('session "s"') and header.endswith(f"{3 + UNITS} events")
    assert len(lines) == 3 + UNITS, lines
    # Each type has its timeline summary (kerman.timeline), not compact JSON.
    assert lines[0].endswith('pydantic-ai/run      run 1 agent "trip" prompt "Plan a trip to Lyon and book it."')
    assert lines[1].endswith('pydantic-ai/unit     run 1 model.request #0 "Checking the weather.", weather({"city":"Lyon"})')
    assert lines[2].endswith('pydantic-ai/unit     run 1 tool weather #0 → "sunny in Lyon"')
    assert lines[4].endswith("pydantic-ai/started  run 1 tool book #0 started")
    assert lines[5].endswith('pydantic-ai/unit     run 1 tool book #0 → "BK-LYON-13"')
    assert all("pydantic-ai/unit" in line for line in lines[1:4] + lines[5:-1])
    assert "pydantic-ai/run-end  run 1 output " in lines[-1] and '{"city":"Lyon"' in lines[-1]


def test_a_run_that_raised_is_resumed_by_the_next_from_its_logged_units(tmp_path, monkeypatch):
    """The book tool fails once (the run raises); the next run with the same prompt replays the
    two model responses and the weather result from the log and runs only what is left."""
    import pai_agent

    real = pai_agent._trace
    failed = []

    def failing_once(trace_dir, name, line):
        if name == "book.log" and not failed:
            failed.append(line)
            raise RuntimeError("the booking service is down")
        real(trace_dir, name, line)

    monkeypatch.setattr(pai_agent, "_trace", failing_once)
    durability = KermanDurability(kerman.MemoryStore(), session_id="s")
    agent = build(tmp_path, [durability])
    with pytest.raises(RuntimeError, match="the booking service is down"):
        _run(agent)
    # book's body raised: the call is over (it returned control), not in doubt, and runs again.
    assert [e.type for e in durability.log.events()] == [RUN, UNIT, UNIT, UNIT, STARTED, RAISED]
    assert _run(agent).output.model_dump() == EXPECTED
    assert _lines(tmp_path, "model.log") == ["0", "1", "2"]
    assert _lines(tmp_path, "weather.log") == ["Lyon"]
    assert _lines(tmp_path, "book.log") == ["Lyon"]
    assert [e.data["run"] for e in durability.log.events(types=[RUN, RUN_END])] == [1, 1]
    durability.close()


@pytest.mark.parametrize("op", ["sync", "write"])
def test_a_run_returns_without_waiting_for_its_end_to_be_synced_and_a_lost_end_is_replayed(op, tmp_path):
    """With sync="units" each unit is synced before the run goes on, but the run's end is not
    awaited (it reaches the disk within the mode's window, or at close): when its sync fails,
    the run has already returned and close() reports the failure. Its write is made by the
    append itself (the session is written through), so a failed write fails the run instead.
    Either way the session holds the run as interrupted with every unit logged, so running it
    again replays it all (no model request, no tool call)."""
    from kerman._core import _FaultPlan

    root = tmp_path / "sessions"
    plan = _FaultPlan(op, seq=7)  # run, five units and book's marker: seq 7 is the run's end
    durability = KermanDurability(kerman.FileStore(str(root), _faults=plan), session_id="s", sync="units")
    if op == "sync":
        assert _run(build(tmp_path, [durability])).output.model_dump() == EXPECTED
    else:
        with pytest.raises(kerman.LogWriteError):
            _run(build(tmp_path, [durability]))
    with pytest.raises(kerman.LogWriteError):
        durability.close()
    assert plan.fired is not None and plan.fired["first_seq"] == 7

    durability = KermanDurability(kerman.FileStore(str(root)), session_id="s")
    assert durability.pending_prompt() == PROMPT
    assert _run(build(tmp_path, [durability])).output.model_dump() == EXPECTED
    assert _lines(tmp_path, "model.log") == ["0", "1", "2"]
    assert _lines(tmp_path, "weather.log") == ["Lyon"]
    assert _lines(tmp_path, "book.log") == ["Lyon"]
    assert [e.type for e in durability.log.events()][-1] == RUN_END
    durability.close()


def test_a_run_whose_last_sync_fails_returns_no_output_and_is_resumed_from_what_was_durable(tmp_path):
    """With sync="effects" the run waits for its end's flush, which also carries the last model
    response (not waited for): when that sync fails the run raises instead of returning an
    output that is not durable, and the next run replays every unit up to book's result (its
    flush was waited for) and requests the last model response again."""
    from kerman._core import _FaultPlan

    root = tmp_path / "sessions"
    plan = _FaultPlan("sync", seq=7)  # run, five units and book's marker: seq 7 is the run's end
    durability = KermanDurability(kerman.FileStore(str(root), _faults=plan), session_id="s", sync="effects")
    with pytest.raises(kerman.LogWriteError):
        _run(build(tmp_path, [durability]))
    assert plan.fired is not None and plan.fired["first_seq"] == 6  # the last model response and the end
    with pytest.raises(kerman.LogWriteError):
        durability.close()

    durability = KermanDurability(kerman.FileStore(str(root)), session_id="s", sync="effects")
    assert durability.pending_prompt() == PROMPT
    assert _run(build(tmp_path, [durability])).output.model_dump() == EXPECTED
    assert _lines(tmp_path, "model.log") == ["0", "1", "2", "2"]
    assert _lines(tmp_path, "weather.log") == ["Lyon"]
    assert _lines(tmp_path, "book.log") == ["Lyon"]
    durability.close()


def test_with_a_postgres_store_the_default_waits_for_every_unit():
    from conftest import postgres_store_in_fresh_schema

    store = postgres_store_in_fresh_schema()
    assert KermanDurability(store, session_id="s").sync == "units"
    assert KermanDurability(store, session_id="s", sync="effects").sync == "effects"
