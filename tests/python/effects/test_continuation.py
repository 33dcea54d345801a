"""Crashed turns are answered (docs/durability.md, "Crashed turns are answered").

A child process (``continuation_child.py``) runs a turn over a ``FileStore`` or a
``PostgresStore`` and blocks inside a model call, between two steps, or inside a ``write``
tool whose in-doubt policy is the default ``fail``, on a read of a pipe this test holds; the
test SIGKILLs it there. A new process reopens the session: with ``resume="continue"`` a
continuation answers the input the crashed turn entered; with ``"close"`` (the default for a
loop you build) nothing changes from the closers. The log is read without Kerman
(``kill_harness.read_log``), which counts the final answers per entered input.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from kill_harness import Place, answers_per_input, check_answers_per_input, check_one_result_per_call, read_effects, read_log

CHILD = str(Path(__file__).with_name("continuation_child.py"))
TIMEOUT = 40

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


def spec(place: Place, block: str, resume: Optional[str] = None) -> str:
    return json.dumps(
        {
            "store": place.store,
            "root": str(place.root) if place.root else None,
            "dsn": place.dsn,
            "session": place.session,
            "effects": str(place.effects),
            "block": block,
            "resume": resume,
        }
    )


def killed(place: Place, mode: str, block: str, *args: str, resume: Optional[str] = None) -> None:
    """Runs the child until it says it is blocked where ``block`` says, then SIGKILLs it."""
    with subprocess.Popen(
        [sys.executable, CHILD, mode, spec(place, block, resume), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        # A child that never blocks where it should is killed after TIMEOUT (the test fails).
        watchdog = threading.Timer(TIMEOUT, proc.kill)
        watchdog.start()
        try:
            lines = []
            for line in proc.stdout:
                lines.append(line.strip())
                if line.strip() == f"BLOCKED {block}":
                    break
        finally:
            watchdog.cancel()
        assert lines[-1:] == [f"BLOCKED {block}"], lines
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=TIMEOUT) == -signal.SIGKILL


def finished(place: Place, mode: str, resume: Optional[str] = None, *args: str) -> List[str]:
    done = subprocess.run(
        [sys.executable, CHILD, mode, spec(place, "none", resume), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.PIPE,
    )
    assert done.returncode == 0 and done.stdout.splitlines()[-1:] == ["done"], done.stderr[-4000:]
    return done.stdout.splitlines()


def place_of(store: str, tmp_path: Path) -> Place:
    return Place.new(store, tmp_path)


def turns(events: List[Dict[str, Any]]) -> List[tuple]:
    """``(turn, continues, ending)`` per turn, from the records."""
    out: Dict[int, list] = {}
    for e in events:
        if e["type"] == "turn/start":
            out[e["data"]["turn"]] = [e["data"]["turn"], e["data"].get("continues"), None]
        elif e["type"] == "turn/end":
            out[e["data"]["turn"]][2] = e["data"]["reason"]["kind"]
    return [tuple(t) for t in out.values()]


STORES = ["file", "postgres"]
WHERE = ["model", "between", "tool"]


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("where", WHERE)
def test_a_crashed_turn_is_answered_by_a_continuation(store: str, where: str, tmp_path: Path) -> None:
    place = place_of(store, tmp_path)
    killed(place, "run", where, "hello")
    at_kill = read_log(place)
    assert [e["type"] for e in at_kill].count("user/message") == 1
    assert finished(place, "resume", "continue")[0] == "resume continue"
    events = read_log(place)
    assert events[: len(at_kill)] == at_kill, "the reopen changed what the killed process wrote"
    assert turns(events) == [(1, None, "interrupted"), (2, 1, "completed")]
    check_answers_per_input(events)
    check_one_result_per_call(events)
    # The continuation entered nothing and claimed nothing: it asked the model over the history.
    second = events[[e["type"] for e in events].index("turn/start", len(at_kill)) :]
    assert "user/message" not in [e["type"] for e in second]
    assert not [e for e in second if e["type"] == "agent/inbox/spliced"]
    effects = read_effects(place)
    ran = [e for e in effects if "tool" in e]
    if where == "tool":
        # The write ran once, before the kill; its call in doubt failed (policy fail) and the
        # model was told so; nothing ran it again.
        assert [r["tool"] for r in ran] == ["pay"]
        [result] = [e for e in events if e["type"] == "tool/result"]
        assert result["data"]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    elif where == "between":
        assert [r["tool"] for r in ran] == ["look"]


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("resume", ["close", None])
def test_reopened_with_close_nothing_changes(store: str, resume: Optional[str], tmp_path: Path) -> None:
    place = place_of(store, tmp_path)
    killed(place, "run", "model", "hello")
    at_kill = read_log(place)
    assert finished(place, "resume", resume)[0] == "resume close"
    events = read_log(place)
    # Only the closers were added: the turn ends interrupted and its input stays unanswered.
    assert events[: len(at_kill)] == at_kill
    assert {e["type"] for e in events[len(at_kill) :]} <= {"step/end", "turn/end"}
    assert turns(events) == [(1, None, "interrupted")]
    assert list(answers_per_input(events).values()) == [0]


@pytest.mark.parametrize("store", STORES)
def test_a_continuation_killed_again_is_continued_again(store: str, tmp_path: Path) -> None:
    place = place_of(store, tmp_path)
    killed(place, "run", "model", "hello")
    killed(place, "resume", "model", resume="continue")
    finished(place, "resume", "continue")
    events = read_log(place)
    assert turns(events) == [(1, None, "interrupted"), (2, 1, "interrupted"), (3, 2, "completed")]
    check_answers_per_input(events)


def test_an_answered_turn_is_not_continued(tmp_path: Path) -> None:
    """Killed after the final answer was logged (in a ``turn_stopping`` hook, before
    ``turn/end``): the turn ends interrupted, but its input has its answer, so a reopen with
    ``continue`` asks nothing: never a second answer."""
    place = place_of("file", tmp_path)
    killed(place, "run", "stopping", "hello")
    finished(place, "resume", "continue")
    events = read_log(place)
    assert turns(events) == [(1, None, "interrupted")]
    check_answers_per_input(events)
    assert len([e for e in read_effects(place) if e.get("model")]) == 1


def test_a_turn_a_tool_concluded_is_not_continued(tmp_path: Path) -> None:
    """Killed after a tool's result concluded the turn (``concludesTurn`` logged, ``turn/end``
    not): the result answered the input, so a reopen with ``continue`` asks the model nothing."""
    place = place_of("file", tmp_path)
    killed(place, "run", "concluded", "hello")
    finished(place, "resume", "continue")
    events = read_log(place)
    assert turns(events) == [(1, None, "interrupted")]
    [result] = [e["data"] for e in events if e["type"] == "tool/result"]
    assert result["concludesTurn"] is True
    check_answers_per_input(events)
    assert len([e for e in read_effects(place) if e.get("model")]) == 1
    assert [e["tool"] for e in read_effects(place) if e.get("tool")] == ["finish"]


def test_a_worker_killed_mid_model_call_answers_every_input(tmp_path: Path) -> None:
    import kerman

    place = place_of("postgres", tmp_path)
    store = kerman.PostgresStore(place.dsn)
    store.create(place.session).close()
    store.enqueue(place.session, kerman.UserMessage("hello"), "next-turn", True)
    killed(place, "work", "model")
    lines = finished(place, "work")
    events = read_log(place)
    assert turns(events) == [(1, None, "interrupted"), (2, 1, "completed")]
    check_answers_per_input(events)
    assert json.loads(lines[-2])["parked"] == 0


def test_a_session_whose_continuations_keep_crashing_is_parked(tmp_path: Path) -> None:
    import kerman

    place = place_of("postgres", tmp_path)
    store = kerman.PostgresStore(place.dsn)
    store.create(place.session).close()
    store.enqueue(place.session, kerman.UserMessage("hello"), "next-turn", True)
    for _ in range(3):
        killed(place, "work", "model")
    lines = finished(place, "work")
    events = read_log(place)
    # Three crashed turns in a row (the first and two continuations): the next worker parks the
    # session instead of asking the model a fourth time.
    assert turns(events) == [(1, None, "interrupted"), (2, 1, "interrupted"), (3, 2, "interrupted")]
    assert json.loads(lines[-2])["parked"] == 1
    [row] = store.sessions(place.session)
    assert row["status"] == "parked"
    assert list(answers_per_input(events).values()) == [0]
    models = [e for e in read_effects(place) if e.get("model")]
    assert [(m["turn"], m["step"]) for m in models] == [(1, 1), (2, 1), (3, 1)]


def test_resume_is_checked() -> None:
    import kerman

    with pytest.raises(ValueError, match=r"resume must be \"continue\" or \"close\", got 'later'"):
        kerman.AgentLoop(kerman.models.EchoModel(), resume="later")  # type: ignore[arg-type]
    assert kerman.AgentLoop(kerman.models.EchoModel()).resume == "close"
    assert kerman.AgentLoop(kerman.models.EchoModel(), resume="continue").resume == "continue"


async def answer(request: Any) -> Any:
    import kerman

    return kerman.ModelReply("answer")


def test_new_input_on_a_resumed_loop_waits_for_the_continuation(tmp_path: Path) -> None:
    """A followup to a loop whose last turn crashed unanswered: the continuation answers the
    old input first, then the new input gets its own turn."""
    import asyncio

    import kerman

    place = place_of("file", tmp_path)
    killed(place, "run", "model", "hello")

    async def main() -> None:
        with kerman.FileStore(place.root).open(place.session) as log:
            loop = kerman.AgentLoop(answer, log=log, resume="continue")
            loop.followup("and now?")
            await loop.when_idle()
            await loop.aclose()

    asyncio.run(main())
    events = read_log(place)
    assert turns(events) == [(1, None, "interrupted"), (2, 1, "completed"), (3, None, "completed")]
    check_answers_per_input(events)


def test_kerman_serve_continues_a_crashed_session(tmp_path: Path) -> None:
    """``kerman serve`` over a file store opens a session whose last turn crashed: its loop
    (built by the model factory, no ``resume=``) continues it at once."""
    pytest.importorskip("starlette")
    import asyncio

    import kerman
    from kerman.web._sessions import Sessions

    place = place_of("file", tmp_path)
    killed(place, "run", "model", "hello")

    async def main() -> None:
        sessions = Sessions(kerman.FileStore(place.root), lambda: answer)
        session = await sessions.get(place.session)
        assert session.loop is not None and session.loop.resume == "continue"
        await session.loop.when_idle()
        await sessions.close()

    asyncio.run(main())
    events = read_log(place)
    assert turns(events) == [(1, None, "interrupted"), (2, 1, "completed")]
    check_answers_per_input(events)


def test_the_notebook_view_says_what_becomes_of_a_crashed_turn(tmp_path: Path) -> None:
    import asyncio

    import kerman

    place = place_of("file", tmp_path)
    killed(place, "run", "model", "hello")

    async def main() -> None:
        with kerman.FileStore(place.root).open(place.session) as log:
            closing = kerman.AgentLoop(answer, log=log)
            assert "turn 1 was interrupted with its input unanswered; resume=&#x27;close&#x27;: it stays so" in closing._repr_html_()
            loop = kerman.AgentLoop(answer, log=log, resume="continue")
            assert "a continuation answers it at the next wake()" in loop._repr_html_()
            loop.wake()
            await loop.when_idle()
            assert "interrupted with its input unanswered" not in loop._repr_html_()
            await loop.aclose()

    asyncio.run(main())
