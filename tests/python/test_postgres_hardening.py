"""PostgresStore against hostile input and races (issue 12, PostgreSQL items): enqueue with ids
that JSON escapes or that occur inside other text, retries racing the owner's claim, NUL in
event types and message ids, the edges of ids and durations, and what connection errors say.

A race is made deterministic with a psql session holding a row the owner's append must wait
for (an uncommitted insert at the seq the owner appends next): the retry is sent while the
claim is held open, and released only once both are seen waiting in `pg_stat_activity`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import uuid
from typing import Any, Callable, List, Optional

import pytest

from kerman import DuplicateMessageError, Inbox, LogError, PostgresStore, UserMessage

from conftest import fresh_schema_dsn, needs_postgres, psql

pytestmark = needs_postgres

DEADLINE = 30.0

# Ids JSON escapes (quote, backslash, control characters), ids that occur inside other text
# (short ones, and ones that are the text of another message), non-ASCII and JSON-significant
# separators.
HOSTILE_IDS = [
    'q"uote',
    "back\\slash",
    "\\",
    '"',
    "ctl\x01\x1f",
    "nl\nx\ty\r",
    "\x7f",
    "a",
    "id",
    "text",
    "é\u2028\u2029",
    "}],\"x",
    "'; DROP TABLE kerman_events; --",
]


def flush(log) -> None:
    async def go() -> None:
        await log.flush()

    asyncio.run(asyncio.wait_for(go(), DEADLINE))


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def inserted(log) -> List[str]:
    return [m["id"] for e in log.events(types="agent/inbox/spliced") for m in e.data["inserted"]]


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def schema_of(dsn: str) -> str:
    """The schema a `fresh_schema_dsn()` searches (for psql, which uses the plain DSN)."""
    return dsn.rsplit("%3D", 1)[1]


def staged_count(dsn: str) -> int:
    return int(psql(f"SELECT count(*) FROM {schema_of(dsn)}.kerman_inbox_staged")[0])


# ---- 1: hostile ids ----------------------------------------------------------------------------


@pytest.mark.parametrize("mid", HOSTILE_IDS)
def test_enqueue_refuses_a_retry_of_a_claimed_message_whatever_its_id(mid):
    dsn = fresh_schema_dsn()
    store, web = PostgresStore(dsn), PostgresStore(dsn)
    with store.create() as log:
        inbox = Inbox(log)
        # Another message whose text (and id prefix) contains the id: must not count as it.
        inbox.append("next-turn", UserMessage(f"{mid} {mid}", id=f"{mid}{mid}-other"))
        web.enqueue(log.id, UserMessage("first", id=mid))
        wait_until(lambda: mid in inbox, "the staged message to reach the inbox")
        flush(log)
        assert inserted(log).count(mid) == 1
        inbox.remove(mid)  # consumed: only the log remembers it now
        flush(log)
        with pytest.raises(DuplicateMessageError) as caught:
            web.enqueue(log.id, UserMessage("retry", id=mid))
        assert caught.value.message_id == mid
        assert staged_count(dsn) == 0
        assert inserted(log).count(mid) == 1


@pytest.mark.parametrize("mid", HOSTILE_IDS)
def test_the_owner_drops_a_staged_row_whose_id_is_in_the_log_whatever_its_id(mid):
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    with store.create() as log:
        inbox = Inbox(log)
        inbox.append("next-turn", UserMessage("once", id=mid))
        inbox.remove(mid)
        flush(log)
        sid = log.id
    # Staged behind enqueue's back (as by a retry that raced a claim before this fix).
    message = json.dumps(UserMessage("twice", id=mid).to_dict(), separators=(",", ":"))
    psql(f"INSERT INTO {schema_of(dsn)}.kerman_inbox_staged (session_id, message_id, message, target, wakeup) "
         f"VALUES ({literal(sid)}, {literal(mid)}, {literal(message)}, 'next-turn', false)")
    with store.open(sid) as log:
        inbox = Inbox(log)
        wait_until(lambda: staged_count(dsn) == 0, "the owner to drop the staged duplicate")
        flush(log)
        assert inserted(log).count(mid) == 1 and mid not in inbox
