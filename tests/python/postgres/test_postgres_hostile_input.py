"""PostgresStore against hostile input and races (issue 12, PostgreSQL items): enqueue with ids
that JSON escapes or that occur inside other text, retries racing the owner's claim, NUL in
event types and message ids, the edges of ids and durations, and what connection errors say.

A race is made deterministic with a psql session holding a row the owner's append must wait
for (an uncommitted insert at the seq the owner appends next): the retry is sent while the
claim is held open, and released only once both are seen waiting in `pg_stat_activity`."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import time
import uuid
from typing import Any, Callable, List

import pytest

from conftest import fresh_schema_dsn, needs_postgres, psql
from kerman import DuplicateMessageError, Inbox, LogError, PostgresStore, SessionLockedError, UserMessage

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
    '}],"x',
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
    psql(
        f"INSERT INTO {schema_of(dsn)}.kerman_inbox_staged (session_id, message_id, message, target, wakeup) "
        f"VALUES ({literal(sid)}, {literal(mid)}, {literal(message)}, 'next-turn', false)"
    )
    with store.open(sid) as log:
        inbox = Inbox(log)
        wait_until(lambda: staged_count(dsn) == 0, "the owner to drop the staged duplicate")
        flush(log)
        assert inserted(log).count(mid) == 1 and mid not in inbox


# ---- 2: a retry racing the owner's claim -------------------------------------------------------


def named(dsn: str, name: str) -> str:
    return f"{dsn}&application_name={name}"


def waiting_on_a_lock(app: str) -> bool:
    return psql(f"SELECT count(*) FROM pg_stat_activity WHERE application_name = {literal(app)} AND wait_event_type = 'Lock'") != ["0"]


class Psql:
    """A psql session fed statements one at a time (to hold a transaction open)."""

    def __init__(self) -> None:
        from conftest import PG_DSN

        self.proc = subprocess.Popen(
            ["psql", PG_DSN, "-XAtq", "-v", "ON_ERROR_STOP=1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def run(self, sql: str, marker: str) -> None:
        """Runs `sql`, then waits for psql to print `marker` (so `sql` has run)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{sql};\nSELECT {literal(marker)};\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + DEADLINE
        while self.proc.stdout.readline().rstrip("\n") != marker:
            assert time.monotonic() < deadline and self.proc.poll() is None, "psql ended early"

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=DEADLINE)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def test_a_retry_sent_while_a_claim_is_uncommitted_is_refused_as_a_duplicate():
    dsn = fresh_schema_dsn()
    schema = schema_of(dsn)
    tag = uuid.uuid4().hex[:12]
    web_app = f"web-{tag}"
    store, web = PostgresStore(dsn), PostgresStore(named(dsn, web_app))
    with store.create() as log:
        sid = log.id
        seq = len(list(log.events()))
    first = web.enqueue(sid, UserMessage("first", id="m-race"))
    # The claim, held open: what an owner's append of the splice inserting the staged message
    # does (advance last_seq, delete the staged row, insert the splice) in a psql transaction.
    splice = json.dumps(
        {
            "type": "agent/inbox/spliced",
            "seq": seq,
            "time": 0,
            "data": {"target": "next-turn", "start": 0, "removedCount": 0, "inserted": [first.to_dict()]},
        },
        separators=(",", ":"),
    )
    claim = Psql()
    outcome: List[Any] = []
    try:
        claim.run(
            f"BEGIN; UPDATE {schema}.kerman_sessions SET last_seq = {seq} WHERE id = {literal(sid)}; "
            f"DELETE FROM {schema}.kerman_inbox_staged WHERE session_id = {literal(sid)}; "
            f"INSERT INTO {schema}.kerman_events (session_id, seq, time, type, record) "
            f"VALUES ({literal(sid)}, {seq}, 0, 'agent/inbox/spliced', {literal(splice)})",
            "claimed",
        )

        def retry() -> None:
            try:
                outcome.append(web.enqueue(sid, UserMessage("retry", id="m-race")))
            except Exception as e:  # noqa: BLE001 - the outcome is asserted below
                outcome.append(e)

        thread = threading.Thread(target=retry)
        thread.start()
        # The retry must wait for the claim's outcome (it cannot know it before the commit).
        wait_until(lambda: waiting_on_a_lock(web_app), "the retry to wait for the claim")
        assert not outcome
        claim.run("COMMIT", "committed")
        thread.join(DEADLINE)
        assert not thread.is_alive()
    finally:
        claim.close()
    assert len(outcome) == 1 and isinstance(outcome[0], DuplicateMessageError), outcome
    assert staged_count(dsn) == 0
    with store.open(sid) as log:
        inbox = Inbox(log)
        flush(log)
        assert inserted(log) == ["m-race"]
        assert [m.text for m in inbox.next_turn] == ["first"]


def test_immediate_retries_of_many_enqueues_are_each_refused_and_each_message_runs_once():
    dsn = fresh_schema_dsn()
    owner, web = PostgresStore(dsn), PostgresStore(dsn)
    n = 150
    with owner.create() as log:
        inbox = Inbox(log)
        accepted_retries = []
        for i in range(n):
            web.enqueue(log.id, UserMessage(f"first-{i}", id=f"r{i}"))
            try:
                web.enqueue(log.id, UserMessage(f"retry-{i}", id=f"r{i}"))
                accepted_retries.append(i)
            except DuplicateMessageError:
                pass
        assert accepted_retries == []
        wait_until(lambda: len(inbox) == n, "every message to reach the inbox")
        flush(log)
        assert sorted(inserted(log)) == sorted(f"r{i}" for i in range(n))
        assert {m.text for m in inbox.next_turn} == {f"first-{i}" for i in range(n)}
        assert staged_count(dsn) == 0


# ---- 3: NUL ------------------------------------------------------------------------------------


def test_an_event_type_with_nul_is_refused_at_append_and_the_batch_around_it_commits():
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    with store.create() as log:
        before = log.append("ok/before", {"n": 1})
        with pytest.raises(ValueError, match=r"event type .*contains NUL"):
            log.append("bad\x00type", {"n": 2})
        after = log.append("ok/after", {"text": "a\x00b", "nested": ["\x00"]})
        assert after.seq == before.seq + 1  # the refused event took no seq
        flush(log)
        sid = log.id
    with store.open(sid) as log:
        assert [(e.type, e.data) for e in log.events()] == [("ok/before", {"n": 1}), ("ok/after", {"text": "a\x00b", "nested": ["\x00"]})]


def test_enqueue_after_a_message_with_nul_answers_duplicate_or_accepts_never_a_raw_error():
    dsn = fresh_schema_dsn()
    store, web = PostgresStore(dsn), PostgresStore(dsn)
    with store.create() as log:
        inbox = Inbox(log)
        inbox.append("next-turn", UserMessage("nul \x00 inside", id="n1"))
        inbox.remove("n1")
        flush(log)
        with pytest.raises(DuplicateMessageError):
            web.enqueue(log.id, UserMessage("again", id="n1"))
        message = web.enqueue(log.id, UserMessage("text with \x00 too", id="n2"))
        wait_until(lambda: "n2" in inbox, "the staged message to reach the inbox")
        assert inbox.get("n2") == message
        with pytest.raises(DuplicateMessageError):
            web.enqueue(log.id, UserMessage("again", id="n2"))
        with pytest.raises(ValueError, match=r"message id .*contains NUL"):
            web.enqueue(log.id, UserMessage("x", id="bad\x00id"))
        flush(log)
        assert inserted(log) == ["n1", "n2"]


# ---- 15: ids and durations at their edges ------------------------------------------------------


def test_ids_longer_than_the_store_keeps_are_refused_with_the_limit_named():
    store = PostgresStore(fresh_schema_dsn())
    for n in (1024, 1):
        with store.create("s" * n) as log:
            assert log.id == "s" * n
    # Incompressible, so the server's index could not take them either (over 2704 bytes).
    long = uuid.uuid4().hex * 100
    with pytest.raises(ValueError, match=r"invalid session id: .* is 3200 bytes long \(at most 1024\)"):
        store.create(long)
    with pytest.raises(ValueError, match=r"invalid session id: .* is 1025 bytes long \(at most 1024\)"):
        store.create("é" * 512 + "x")
    assert not store.exists(long) and store.list() == sorted(["s" * 1024, "s"])
    with store.create() as log:
        with pytest.raises(ValueError, match=r"message id .* is 3200 bytes long \(at most 1024\)"):
            store.enqueue(log.id, UserMessage("x", id=long))
        store.enqueue(log.id, UserMessage("x", id="m" * 1024))


@pytest.mark.parametrize(
    "keyword,value,bounds",
    [
        ("lease_ttl", 1e300, "0 \\(no renewal\\) or from 0.1 to 86400 seconds"),
        ("lease_ttl", 1e-9, "0 \\(no renewal\\) or from 0.1 to 86400 seconds"),
        ("lease_ttl", 0.05, "0 \\(no renewal\\) or from 0.1 to 86400 seconds"),
        ("request_timeout", 1e-9, "0 \\(no limit\\) or from 0.001 to 86400 seconds"),
        ("request_timeout", 1e300, "0 \\(no limit\\) or from 0.001 to 86400 seconds"),
        ("reconnect_timeout", 1e-9, "0 \\(one try\\) or from 0.001 to 3600 seconds"),
        ("reconnect_timeout", 4000.0, "0 \\(one try\\) or from 0.001 to 3600 seconds"),
    ],
)
def test_durations_outside_their_bounds_are_refused_naming_them(keyword, value, bounds):
    with pytest.raises(ValueError, match=f"{keyword} must be {bounds}, got {re.escape(repr(value))}$"):
        PostgresStore(fresh_schema_dsn(), **{keyword: value})


def test_durations_at_their_bounds_are_kept():
    store = PostgresStore(fresh_schema_dsn(), lease_ttl=86400, request_timeout=0.001, reconnect_timeout=3600)
    assert (store.lease_ttl, store.request_timeout, store.reconnect_timeout) == (86400, 0.001, 3600)
    store = PostgresStore(fresh_schema_dsn(), lease_ttl=86400, request_timeout=86400, reconnect_timeout=0.001)
    with store.create() as log:  # the longest lease fits the server's interval arithmetic
        log.append("x", {})
        flush(log)
    store = PostgresStore(fresh_schema_dsn(), lease_ttl=0.1)
    with store.create() as log:
        log.append("x", {})
        flush(log)


# ---- 16: what connection errors say ------------------------------------------------------------


def test_a_refused_connection_names_the_host_port_and_os_error_but_not_the_password():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        for dsn in (
            f"postgresql://kerman:hunter2secret@127.0.0.1:{port}/db",
            f"host=127.0.0.1 port={port} user=kerman password=hunter2secret dbname=db",
        ):
            with pytest.raises(LogError) as caught:
                PostgresStore(dsn)
            text = str(caught.value)
            assert f"127.0.0.1:{port}" in text and "refused" in text.lower(), text
            assert "hunter2" not in text


@pytest.mark.parametrize(
    "dsn,part",
    [
        ("host=127.0.0.1 port=notaport password=hunter2secret", "port"),
        ("host=127.0.0.1 sslmode=sometimes password=hunter2secret", "sslmode"),
        ("host=127.0.0.1 frobnicate=1 password=hunter2secret", "frobnicate"),
        ("postgresql://kerman:hunter2secret@127.0.0.1:notaport/db", "port"),
        ("host=127.0.0.1 password='hunter2secret", "unterminated"),
    ],
)
def test_a_bad_dsn_names_the_part_that_is_wrong_but_not_the_password(dsn, part):
    with pytest.raises(LogError) as caught:
        PostgresStore(dsn)
    text = str(caught.value)
    assert "invalid connection string" in text and part in text, text
    assert "hunter2" not in text


# ---- 7: close during an outage -----------------------------------------------------------------


def test_a_log_closed_while_the_server_is_unreachable_gives_its_lease_up_locally():
    # A role of its own, so the server can refuse exactly this store's reconnects.
    role = f"kerman_py_{uuid.uuid4().hex[:12]}"
    psql(f"CREATE ROLE {role} SUPERUSER LOGIN")
    dsn = fresh_schema_dsn()
    scheme, rest = dsn.split("://", 1)
    ttl = 1.0
    store = PostgresStore(f"{scheme}://{role}@{rest.split('@', 1)[-1]}", reconnect_timeout=0.3, lease_ttl=ttl)
    try:
        log = store.create()
        log.append("x", 1)
        flush(log)
        psql(f"ALTER ROLE {role} NOLOGIN")
        psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        with pytest.raises(LogError, match="gave up"):
            log.close()  # the release cannot reach the server
        assert log.closed
        psql(f"ALTER ROLE {role} LOGIN")
        assert store.exists(log.id)  # reconnected (a reconnect renews the leases still held)
        # Not renewed any more: the lease lapses after lease_ttl and the session opens again,
        # here and from another store.
        deadline = time.monotonic() + 20 * ttl
        while True:
            try:
                with store.open(log.id) as again:
                    assert [e.data for e in again] == [1]
                break
            except SessionLockedError:
                assert time.monotonic() < deadline, "the lease is still renewed after close()"
                time.sleep(ttl / 10)
        with PostgresStore(dsn).open(log.id) as other:
            assert [e.data for e in other] == [1]
    finally:
        psql(f"ALTER ROLE {role} LOGIN")


# ---- 8: a store inherited through fork() -------------------------------------------------------


def test_a_store_inherited_through_fork_raises_in_the_child_and_the_parent_carries_on():
    import os

    store = PostgresStore(fresh_schema_dsn())
    log = store.create()
    log.append("x", 1)
    flush(log)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report each call's outcome, never return into pytest
        code = 1
        try:
            os.close(read)
            outcomes = []
            for call in (
                store.list,
                lambda: store.exists(log.id),
                lambda: store.create(),
                lambda: log.append("x", 2),
                lambda: flush(log),
                log.close,
            ):
                try:
                    call()
                    outcomes.append("ok")
                except LogError as e:
                    outcomes.append(str(e))
            os.write(write, json.dumps(outcomes).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    deadline = time.monotonic() + DEADLINE
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            os.close(read)
            raise AssertionError("the child hung on the inherited store")
        time.sleep(0.01)
    with os.fdopen(read, "rb") as f:
        outcomes = json.loads(f.read() or b"null")
    assert outcomes is not None and len(outcomes) == 6, outcomes
    for outcome in outcomes:
        assert "fork()" in outcome and "create the PostgresStore in the child" in outcome, outcomes
    # The parent's store and log are untouched by the child.
    log.append("x", 3)
    flush(log)
    log.close()
    with store.open(log.id) as again:
        assert [e.data for e in again] == [1, 3]


# ---- hostile session ids through every PostgreSQL path -----------------------------------------


@pytest.mark.parametrize("sid", ['q"uote', "back\\slash", "ctl\x01\n", "'; --", "é\u2028", "s" * 1024])
def test_hostile_session_ids_create_enqueue_follow_and_reopen(sid):
    dsn = fresh_schema_dsn()
    store, web = PostgresStore(dsn), PostgresStore(dsn)
    with store.create(sid) as log:
        inbox = Inbox(log)
        follower = web.follow(sid)
        try:
            web.enqueue(sid, UserMessage("hi", id=sid))  # the message id is the same hostile text
            wait_until(lambda: sid in inbox, "the staged message to reach the inbox")
            flush(log)
            wait_until(lambda: inserted(follower) == [sid], "the follower to see the splice")
            with pytest.raises(DuplicateMessageError):
                web.enqueue(sid, UserMessage("again", id=sid))
        finally:
            follower.close()
    assert store.list() == [sid] and store.exists(sid)
    with store.open(sid) as log:
        assert inserted(log) == [sid]
    store.delete(sid)
    assert not store.exists(sid)
