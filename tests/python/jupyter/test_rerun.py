"""Re-running the cells of a notebook in one process (issue 15 part 2): the cell that opens a
session (``store.open(id, reuse=True)`` hands back the log this process holds), the cell that
creates the ``AgentLoop`` (a new loop takes over from an idle earlier one, and is refused while
the earlier one runs a turn), and a wait that is cancelled (the turn goes on, with a warning).
Locking across processes is unchanged. docs/notebooks.md describes all of it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kerman
from kerman import AgentLoop, FileStore, InboxError, LoopError, MemoryStore, SessionLockedError
from kerman.models import EchoModel, ScriptedModel

SAFETY_NET = 60  # seconds: only so a hung child fails the test instead of blocking it


def open_or_create(store: FileStore, id: str) -> kerman.SessionLog:
    """The notebook's first cell."""
    return store.open(id, reuse=True) if store.exists(id) else store.create(id)


# ---- store.open(id, reuse=True) -------------------------------------------------------------


def test_reuse_hands_back_the_log_this_process_holds_from_any_store_over_the_folder(tmp_path):
    log = open_or_create(FileStore(tmp_path / "sessions"), "demo")
    log.append("note/added", {"run": 1})
    # the cell runs again: a new store, the same folder spelled another way
    again = open_or_create(FileStore(tmp_path / "sessions" / ".." / "sessions"), "demo")
    assert again is log
    # without reuse it is still refused, and the error names the way out
    with pytest.raises(SessionLockedError, match=r"store.open\(id, reuse=True\)"):
        FileStore(tmp_path / "sessions").open("demo")
    log.close()
    # a closed log is not handed back: the session is opened afresh and replays
    fresh = FileStore(tmp_path / "sessions").open("demo", reuse=True)
    assert fresh is not log and not fresh.closed
    assert [e.data for e in fresh.events(types="note/added")] == [{"run": 1}]
    fresh.close()


def test_reuse_of_a_session_nobody_holds_opens_it(tmp_path):
    store = FileStore(tmp_path)
    store.create("s").close()
    log = store.open("s", reuse=True)
    assert not log.closed and store.open("s", reuse=True) is log
    log.close()
    with pytest.raises(kerman.SessionNotFoundError):
        store.open("missing", reuse=True)


def test_reuse_on_a_memory_store():
    store = MemoryStore()
    log = store.create("m")
    assert store.open("m", reuse=True) is log
    with pytest.raises(SessionLockedError, match=r"reuse=True"):
        store.open("m")
    log.close()
    reopened = store.open("m", reuse=True)
    assert reopened is not log and store.open("m", reuse=True) is reopened
    # sessions are the store's own: another MemoryStore has no session "m"
    with pytest.raises(kerman.SessionNotFoundError):
        MemoryStore().open("m", reuse=True)


def test_another_process_is_still_refused_while_this_one_holds_the_session(tmp_path):
    log = FileStore(tmp_path).create("held")
    child = textwrap.dedent(f"""
        import kerman
        try:
            kerman.FileStore({str(tmp_path)!r}).open("held", reuse=True)
        except kerman.SessionLockedError as e:
            print("refused:", e)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=SAFETY_NET, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('refused: session "held" is locked: another process or handle has it open')
    log.close()


# ---- a new AgentLoop over the same log --------------------------------------------------------


def test_a_new_loop_takes_over_from_an_idle_one_and_the_conversation_goes_on(tmp_path):
    store = FileStore(tmp_path)

    async def main() -> None:
        log = open_or_create(store, "chat")
        first = AgentLoop(ScriptedModel(["one"]), log=log)
        first.followup("first run")
        await first.when_idle()
        first.inject("left pending by the first run")
        # Run All again: same log, new loop
        log = open_or_create(store, "chat")
        second = AgentLoop(ScriptedModel(["two"]), log=log)
        assert first.closed and not second.closed
        assert [m.text for m in second.inbox.next_step] == ["left pending by the first run"]
        with pytest.raises(LoopError, match=r"was replaced by a newer one \(<AgentLoop turn=1 .*\); send input to that one"):
            first.followup("to the old loop")
        second.followup("second run")
        await second.when_idle()
        assert second.turn == 2
        assert [m.text for m in log.transcript()] == ["first run", "one", "left pending by the first run", "second run", "two"]
        await first.aclose()  # the replaced loop's aclose leaves the log to its successor
        assert not log.closed
        await second.aclose()
        log.close()

    asyncio.run(main())


def test_the_replaced_loop_of_a_private_log_does_not_close_it():
    async def main() -> None:
        first = AgentLoop(EchoModel())
        second = AgentLoop(EchoModel(), log=first.log)
        await first.aclose()
        assert not second.log.closed
        second.followup("still open")
        await second.when_idle()
        await second.aclose()

    asyncio.run(main())


def test_a_new_loop_is_refused_while_the_earlier_one_runs_a_turn():
    async def main() -> None:
        entered = asyncio.Event()

        async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
            entered.set()
            await asyncio.get_running_loop().create_future()  # until cancelled
            raise AssertionError("unreachable")

        log = MemoryStore().create("busy")
        first = AgentLoop(model, log=log)
        first.followup("slow")
        await entered.wait()
        with pytest.raises(
            LoopError,
            match=r"session 'busy' already has an AgentLoop running turn 1 in this process "
            r"\(<AgentLoop turn=1 status=running .*\); stop it with its cancel\(\)",
        ):
            AgentLoop(EchoModel(), log=log)
        assert not first.closed and first.status == "running"  # untouched
        first.cancel()
        await first.when_idle()
        second = AgentLoop(EchoModel(), log=log)  # now it gives way
        assert first.closed
        await second.aclose()

    asyncio.run(main())


def test_a_bare_inbox_still_refuses_a_second_one():
    log = MemoryStore().create()
    held = kerman.Inbox(log)
    with pytest.raises(InboxError, match="already has an inbox"):
        kerman.Inbox(log)
    with pytest.raises(InboxError, match="already has an inbox"):
        AgentLoop(EchoModel(), log=log)  # an Inbox that is no AgentLoop does not give way
    held.close()
    AgentLoop(EchoModel(), log=log)


# ---- a cancelled wait ---------------------------------------------------------------------------


def test_a_cancelled_wait_warns_that_the_turn_goes_on_and_cancel_stops_it():
    async def main() -> None:
        entered = asyncio.Event()

        async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
            entered.set()
            await asyncio.get_running_loop().create_future()
            raise AssertionError("unreachable")

        loop = AgentLoop(model)
        loop.followup("slow")
        waiter = asyncio.ensure_future(loop.when_idle())
        await entered.wait()
        waiter.cancel()
        with pytest.warns(kerman.TurnStillRunningWarning) as caught:
            with pytest.raises(asyncio.CancelledError):
                await waiter
        assert len(caught) == 1
        text = str(caught[0].message)
        assert f"waiting for session {loop.log.id!r} was cancelled, but its turn 1 is still running" in text
        assert "loop.cancel() stops it" in text and "await loop.when_idle() waits for it again" in text
        assert issubclass(kerman.TurnStillRunningWarning, RuntimeWarning)
        assert loop.status == "running"
        loop.cancel()
        await loop.when_idle()
        assert list(loop.log.events(types="turn/end"))[-1].data["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}

    asyncio.run(main())


def test_the_example_notebook_is_valid(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(Path(__file__).resolve().parents[3] / "examples" / "notebook.ipynb", as_version=4)
    nbformat.validate(nb)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), "stored without outputs"
