"""PostgresStore across processes (issue 6, part B): NOTIFY-driven read-only followers,
`store.enqueue` from web-style processes, and workers racing for one session's messages.

Beyond SPEC: `PostgresStore.follow(id)` (a read-only `SessionLog` that grows as the owner
commits; appends raise `LogError`) and `PostgresStore.enqueue(id, message, target="next-turn",
wakeup=True)` (stages a message for the owner; `DuplicateMessageError` for an id already staged
or in the log, `SessionNotFoundError` for an unknown session). Against the issue's wording
("the owner re-folds new splices into its inbox before the next claim"): the owner takes staged
input when its NOTIFY arrives (about a millisecond), not by a database read before every claim,
so a message staged just before a claim joins the next one (docs/distributed.md).

Children are real processes (tests/python/postgres/pg_child.py); the parent waits on their output lines
or on database state, each wait bounded by a deadline."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import List

import pytest

from conftest import PG_DSN as DSN
from conftest import needs_postgres, psql
from kerman import AgentLoop, DuplicateMessageError, LogError, PostgresStore, SessionNotFoundError
from kerman.models import EchoModel

pytestmark = needs_postgres

CHILD = os.path.join(os.path.dirname(__file__), "pg_child.py")
DEADLINE = 60.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE + 30))


async def flushed(log) -> None:
    await log.flush()


class Child:
    """A child process whose stdout lines are read with a deadline."""

    def __init__(self, *args: str, stdin: bool = False) -> None:
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, *args],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self.lines: List[str] = []

    async def line(self) -> str:
        assert self.proc.stdout is not None
        text = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), DEADLINE)
        if not text:
            raise AssertionError(f"child exited ({self.proc.wait()}) before writing the expected line")
        self.lines.append(text.rstrip("\n"))
        return self.lines[-1]

    async def until(self, prefix: str) -> str:
        while True:
            line = await self.line()
            if line.startswith(prefix):
                return line

    def finish(self) -> int:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
            self.proc.stdin = None
        rest, _ = self.proc.communicate(timeout=DEADLINE)
        self.lines.extend(rest.splitlines())
        if self.proc.returncode != 0:
            self.stderr.seek(0)
            print(f"child {self.proc.args[2:]} exited with {self.proc.returncode}:\n{self.stderr.read()}", file=sys.stderr)
        self.stderr.close()
        return self.proc.returncode


async def wait_for_state(check, what: str) -> None:
    """Polls database state until `check()` holds, failing after the deadline."""
    end = time.monotonic() + DEADLINE
    while not await asyncio.to_thread(check):
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def inserted_ids(log) -> List[str]:
    return [m["id"] for e in log.events(types="agent/inbox/spliced") for m in e.data["inserted"]]


def events_of(line_list: List[str]) -> List[tuple]:
    out = []
    for line in line_list:
        if line.startswith("e "):
            _, seq, kind, data = line.split(" ", 3)
            out.append((int(seq), kind, json.loads(data)))
    return out


# ---- followers ---------------------------------------------------------------------------------


def test_a_follower_in_another_process_sees_the_writers_events_in_order_across_a_lost_listen_connection():
    store = PostgresStore(DSN)
    log = store.create()

    async def scenario() -> List[tuple]:
        log.append("test/n", {"i": 0})
        await log.flush()
        follower = Child("follow", DSN, log.id, "7")
        await follower.until("ready")
        for i in (1, 2):
            log.append("test/n", {"i": i})
        await log.flush()
        while len(events_of(follower.lines)) < 3:
            await follower.line()
        # Kill the follower's LISTEN connection; commits meanwhile notify nobody there.
        pid = follower.proc.pid
        name = f"kerman-listen-{pid}"
        before = psql(f"SELECT pid FROM pg_stat_activity WHERE application_name = '{name}'")
        assert len(before) == 1, before
        assert psql(f"SELECT pg_terminate_backend({before[0]})") == ["t"]
        for i in (3, 4, 5, 6):
            log.append("test/n", {"i": i})
        await log.flush()
        await follower.until("done")
        assert follower.finish() == 0
        # It did reconnect (a new backend under the same name), not merely poll.
        after = psql(f"SELECT pid FROM pg_stat_activity WHERE application_name = '{name}'")
        assert before[0] not in after
        return events_of(follower.lines)

    seen = run(scenario())
    assert [(seq, kind, data) for seq, kind, data in seen] == [(i, "test/n", {"i": i}) for i in range(7)]
    log.close()


def test_a_follower_refuses_appends_tails_live_and_stops_on_close():
    owner = PostgresStore(DSN)
    log = owner.create()
    log.append("test/n", {"i": 0})
    run(flushed(log))
    follower = PostgresStore(DSN).follow(log.id)
    assert [e.seq for e in follower.events()] == [0]

    async def scenario() -> List[int]:
        seen: List[int] = []
        live: List[int] = []
        unsubscribe = follower.subscribe(lambda e: live.append(e.seq))

        async def tail() -> None:
            async for event in follower.tail():
                seen.append(event.seq)
                if len(seen) == 3:
                    return

        task = asyncio.create_task(tail())
        log.append("test/n", {"i": 1})
        log.append("test/n", {"i": 2})
        await log.flush()
        await asyncio.wait_for(task, DEADLINE)
        unsubscribe()
        assert live == [1, 2]
        return seen

    assert run(scenario()) == [0, 1, 2]
    with pytest.raises(LogError, match="read-only"):
        follower.append("test/n", {"i": 9})
    follower.close()
    # Closed: it no longer follows (the owner's next commit does not reach it).
    log.append("test/n", {"i": 3})
    run(flushed(log))
    assert len(follower) == 3
    log.close()


# ---- enqueue -----------------------------------------------------------------------------------


def test_enqueue_from_another_process_while_a_loop_runs_starts_a_turn_and_is_claimed_once():
    store = PostgresStore(DSN)
    log = store.create()

    async def scenario() -> str:
        loop = AgentLoop(EchoModel(), log=log)
        claimed: List[str] = []
        turn_ended = asyncio.Event()
        loop.on("agent/inbox/claimed", lambda e: claimed.append(e.message.id))
        log.subscribe(lambda e: e.type == "turn/end" and turn_ended.set())
        # The loop is busy with a local prompt while the web process enqueues.
        loop.followup("local prompt")
        web = Child("enqueue", DSN, log.id, "1", "web")
        (line,) = [await web.until("q ")]
        assert web.finish() == 0
        message_id = line.split()[1]
        await wait_for_state(lambda: message_id in claimed, "the enqueued message to be claimed")
        await loop.when_idle()
        await log.flush()
        assert claimed.count(message_id) == 1
        return message_id

    message_id = run(scenario())
    splices = [e for e in log.events(types="agent/inbox/spliced") if any(m["id"] == message_id for m in e.data["inserted"])]
    assert len(splices) == 1  # the receipt, exactly once
    texts = [e.data["content"][0]["text"] for e in log.events(types="user/message")]
    assert texts == ["local prompt", "web-0"]
    assert psql(f"SELECT count(*) FROM kerman_inbox_staged WHERE session_id = '{log.id}'") == ["0"]
    log.close()


def test_the_owner_picks_up_input_staged_while_its_listen_connection_was_down():
    store = PostgresStore(DSN)
    log = store.create()
    web = PostgresStore(DSN)
    name = f"kerman-listen-{os.getpid()}"

    async def scenario() -> None:
        loop = AgentLoop(EchoModel(), log=log)
        first = web.enqueue(log.id, "before", wakeup=False)
        await wait_for_state(lambda: first.id in inserted_ids(log), "the first message to arrive")
        # Every LISTEN connection of this process goes; the next message's NOTIFY may find
        # none, and the re-LISTEN's catch-up read must pick it up.
        killed = psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{name}'")
        assert killed and set(killed) == {"t"}
        second = web.enqueue(log.id, "while reconnecting", wakeup=False)
        await wait_for_state(lambda: second.id in inserted_ids(log), "the second message to arrive")
        await log.flush()
        assert [m.id for m in loop.inbox.next_turn] == [first.id, second.id]

    run(scenario())
    assert psql(f"SELECT count(*) FROM kerman_inbox_staged WHERE session_id = '{log.id}'") == ["0"]
    log.close()


def test_enqueue_with_no_owner_waits_for_the_next_open():
    store = PostgresStore(DSN)
    log = store.create()
    log.close()
    message = PostgresStore(DSN).enqueue(log.id, "while nobody runs", target="next-step", wakeup=False)
    assert psql(f"SELECT message_id, target, wakeup FROM kerman_inbox_staged WHERE session_id = '{log.id}'") == [
        f"{message.id}|next-step|f"
    ]

    async def scenario() -> None:
        reopened = store.open(log.id)
        loop = AgentLoop(EchoModel(), log=reopened)
        await wait_for_state(lambda: message.id in loop.inbox, "the staged message to reach the inbox")
        assert loop.status == "idle"  # wakeup=False: queued, no turn
        await reopened.flush()
        assert psql(f"SELECT count(*) FROM kerman_inbox_staged WHERE session_id = '{log.id}'") == ["0"]
        assert [m.id for m in loop.inbox.next_step] == [message.id]
        reopened.close()

    run(scenario())


def test_enqueue_refuses_duplicate_ids_and_unknown_sessions():
    store = PostgresStore(DSN)
    log = store.create()
    web = PostgresStore(DSN)
    message = web.enqueue(log.id, "once")
    with pytest.raises(DuplicateMessageError):
        web.enqueue(log.id, message)  # still staged
    with pytest.raises(SessionNotFoundError):
        web.enqueue(f"no-such-session-{message.id}", "x")
    with pytest.raises(ValueError):
        web.enqueue(log.id, "x", target="later")
    with pytest.raises(SessionNotFoundError):
        web.follow(f"no-such-session-{message.id}")

    async def scenario() -> None:
        loop = AgentLoop(EchoModel(), log=log)  # held: a dropped loop is freed, and its inbox with it
        await wait_for_state(lambda: message.id in inserted_ids(log), "the staged message to reach the inbox")
        await loop.aclose()
        await log.flush()

    run(scenario())
    with pytest.raises(DuplicateMessageError):
        web.enqueue(log.id, message)  # now in the log
    log.close()


# ---- racing workers ----------------------------------------------------------------------------


def test_two_workers_racing_for_a_session_claim_each_enqueued_message_exactly_once():
    store = PostgresStore(DSN)
    log = store.create()
    id = log.id
    log.close()
    n = 24

    async def scenario() -> List[Child]:
        workers = [Child("worker", DSN, id, label, stdin=True) for label in ("w1", "w2")]
        web = Child("enqueue", DSN, id, str(n), "race")
        ids = [(await web.until("q ")).split()[1] for _ in range(n)]
        assert web.finish() == 0

        def all_claimed() -> bool:
            follower = PostgresStore(DSN).follow(id)
            try:
                from kerman import InboxProjection

                inserted = {m["id"] for e in follower.events(types="agent/inbox/spliced") for m in e.data["inserted"]}
                pending = len(InboxProjection.fold(follower.events()).next_turn)
                staged = psql(f"SELECT count(*) FROM kerman_inbox_staged WHERE session_id = '{id}'")
                return set(ids) <= inserted and pending == 0 and staged == ["0"]
            finally:
                follower.close()

        await wait_for_state(all_claimed, "every enqueued message to be claimed")
        for w in workers:
            assert w.finish() == 0
        return workers

    workers = run(scenario())
    final = PostgresStore(DSN).follow(id)
    inserted = Counter(m["id"] for e in final.events(types="agent/inbox/spliced") for m in e.data["inserted"])
    assert len(inserted) == n and set(inserted.values()) == {1}
    texts = Counter(e.data["content"][0]["text"] for e in final.events(types="user/message"))
    assert texts == Counter(f"race-{i}" for i in range(n))  # each claimed (run as a turn) once
    claimed = Counter(line.split()[1] for w in workers for line in w.lines if line.startswith("claimed "))
    assert set(claimed) == set(inserted) and set(claimed.values()) == {1}
    # Which worker held the lease when is up to the scheduler (both contend throughout); the
    # claims above hold whatever the interleaving was.
    assert sum(1 for w in workers for line in w.lines if line.startswith("open ")) >= 1
    final.close()
