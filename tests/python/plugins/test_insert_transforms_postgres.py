"""Insert transforms on input another process enqueued (``PostgresStore.enqueue``): the owner
passes it through its transforms when it takes it in, so a redacted secret never reaches the
session's log; a refused message is dropped from the staging table (its sender is gone) and
reported on the ``kerman`` logger."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import pytest

import kerman
from conftest import PG_DSN as DSN
from conftest import needs_postgres, psql
from kerman.models import EchoModel

pytestmark = needs_postgres

DEADLINE = 60.0
SECRET = "sk-live-0123456789"


async def wait_for(check: Callable[[], bool], what: str) -> None:
    """Polls state another thread changes until ``check()`` holds, failing after the deadline."""
    end = time.monotonic() + DEADLINE
    while not await asyncio.to_thread(check):
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def guard(message: kerman.UserMessage, target: str) -> Any:
    if "deploy" in message.text:
        return kerman.Refuse("deploys go through the release bot")
    return message.with_content(message.text.replace(SECRET, "[redacted]"))


def test_enqueued_input_passes_the_owners_transforms(caplog: pytest.LogCaptureFixture) -> None:
    store = kerman.PostgresStore(DSN)
    log = store.create()
    web = kerman.PostgresStore(DSN)

    def staged() -> int:
        return int(psql(f"SELECT count(*) FROM kerman_inbox_staged WHERE session_id = '{log.id}'")[0])

    async def scenario() -> None:
        loop = kerman.AgentLoop(EchoModel(), log=log)
        loop.on_insert(guard)
        kept = web.enqueue(log.id, f"key {SECRET}", wakeup=False)
        refused = web.enqueue(log.id, "deploy it", wakeup=False)
        await wait_for(lambda: kept.id in loop.inbox and staged() == 0, "both staged rows to be taken or dropped")
        assert [m.text for m in loop.inbox.next_turn] == ["key [redacted]"]
        assert refused.id not in loop.inbox
        await log.flush()
        assert all(SECRET not in e.to_json() and "deploy it" not in e.to_json() for e in log.events())
        await loop.aclose()

    with caplog.at_level(logging.ERROR, logger="kerman"):
        asyncio.run(asyncio.wait_for(scenario(), DEADLINE + 30))
    reports = [r.getMessage() for r in caplog.records if refused_report(r.getMessage())]
    assert len(reports) == 1, [r.getMessage() for r in caplog.records]
    log.close()


def refused_report(text: str) -> bool:
    return "enqueued by another process was dropped" in text and "deploys go through the release bot" in text
