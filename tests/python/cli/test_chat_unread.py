"""``kerman chat`` never hides a prompt a turn claimed and was cancelled before reading: the
resumed session says so, and ``/resend`` sends it again (``requeue_claimed``), in a real
pseudo-terminal (pexpect)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

import kerman
from kerman.models import EchoModel

pexpect = pytest.importorskip("pexpect")

TIMEOUT = 30


def cancelled_before_read(store: kerman.FileStore, session: str) -> None:
    """A session whose turn 1 claimed "deploy to staging" and was cancelled while a pre_step
    plugin (an approval) held the batch."""

    async def main() -> None:
        log = store.create(session)
        loop = kerman.AgentLoop(EchoModel(), log=log)
        claimed = asyncio.Event()

        @loop.pre_step
        async def approval(step, next):
            claimed.set()
            await asyncio.Event().wait()  # until cancelled

        loop.followup("deploy to staging")
        await asyncio.wait_for(claimed.wait(), TIMEOUT)
        loop.cancel(keep_inbox=True)
        await loop.when_idle()
        await loop.aclose()
        await log.aclose()

    asyncio.run(main())


def test_a_resumed_chat_shows_the_unread_prompt_and_resends_it(tmp_path: Path) -> None:
    store = kerman.FileStore(tmp_path / "store")
    cancelled_before_read(store, "door")
    (tmp_path / "echo_factory.py").write_text("from kerman.models import EchoModel\n\ndef echo():\n    return EchoModel()\n")
    env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": str(tmp_path)}
    env.pop("KERMAN_CHAT_DIR", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "kerman", "chat", "--store", str(tmp_path / "store"), "--session", "door", "--model", "echo_factory:echo"],
        env=env,
        encoding="utf-8",
        timeout=TIMEOUT,
        dimensions=(40, 200),
    )
    child.logfile_read = sys.stdout
    child.expect("cancelled before it was read: deploy to staging — /resend 1 sends it again")
    child.expect("> ")
    child.sendline("/resend 7")
    child.expect("turn 7 left nothing unread")
    child.sendline("/resend")
    child.expect("sent again: deploy to staging")
    child.expect("» prompt: deploy to staging")
    child.expect("\\r\\ndeploy to staging")  # the echo
    child.expect("> ")
    child.sendline("/resend")
    child.expect("nothing to resend")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    with store.open("door") as log:
        ends = [e.data["reason"]["kind"] for e in log.events() if e.type == "turn/end"]
        assert ends == ["aborted", "completed"]
        assert [m.text for m in log.transcript()] == ["deploy to staging", "deploy to staging"]
        assert log.transcript().unread() == []
