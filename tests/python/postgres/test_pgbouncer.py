"""PostgresStore behind PgBouncer in transaction pooling mode (issue 17, item 3), for real:
scripts/pgbouncer-test.sh starts Debian's PgBouncer on 127.0.0.1:54339 in front of the test
server (or finds it running; only one this module started is stopped, by its pid). Each test
module run gets a database of its own (a per-test ``search_path`` in the DSN's ``options``
cannot reach the server through transaction pooling).

Shown: with named prepared statements (the default) stores fail there, as docs/postgres.md
says; with ``prepared_statements=False`` many stores at once create, open, append, read,
enqueue and close sessions, an agent loop runs a turn and a ``kerman.Worker`` takes and runs
enqueued input; with ``listen_dsn`` pointing at the server directly, followers and enqueue
wake-ups hear their notifications."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import uuid
from typing import List

import pytest

from conftest import PG_DSN, needs_postgres, psql
from kerman import AgentLoop, LogError, PostgresStore, Worker
from kerman.models import EchoModel

pytestmark = needs_postgres

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "..", "scripts", "pgbouncer-test.sh")
BOUNCER_PORT = 54339
DEADLINE = 60.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE))


async def flushed(log) -> None:
    await log.flush()


@pytest.fixture(scope="module")
def dsns():
    """(through PgBouncer, direct) DSNs of a fresh database."""
    if not PG_DSN.startswith("postgresql://postgres@127.0.0.1:"):
        pytest.skip("PgBouncer is set up for the local test server only")
    out = subprocess.run(["bash", SCRIPT, "start"], check=True, capture_output=True, text=True, timeout=300).stdout.split()
    pid, started = out[0], out[1] == "1"
    db = f"kerman_pgb_{uuid.uuid4().hex[:12]}"
    psql(f"CREATE DATABASE {db}")
    direct = PG_DSN.rsplit("/", 1)[0] + f"/{db}"
    bounced = f"postgresql://postgres@127.0.0.1:{BOUNCER_PORT}/{db}"
    try:
        yield bounced, direct
    finally:
        psql(f"DROP DATABASE {db} WITH (FORCE)")
        if started:
            subprocess.run(["bash", SCRIPT, "stop", pid], check=True, timeout=60)


def bounced_store(dsns, **kw) -> PostgresStore:
    bounced, direct = dsns
    return PostgresStore(bounced, prepared_statements=False, listen_dsn=direct, **kw)


def use(store: PostgresStore, sessions: int) -> List[str]:
    """Creates, appends to, reads, enqueues for, reopens and closes `sessions` sessions."""
    ids = []
    for i in range(sessions):
        log = store.create(f"pgb-{uuid.uuid4()}")
        try:
            for n in range(3):
                log.append("x/e", n)
            run(flushed(log))
            assert store.exists(log.id)
        except LogError:
            with contextlib.suppress(LogError):
                log.close()
            raise
        log.close()
        store.enqueue(log.id, f"hello {i}", wakeup=False)
        with store.open(log.id) as again:
            assert [e.data for e in again.events(types="x/e")] == [0, 1, 2]
        ids.append(log.id)
    return ids


def test_named_prepared_statements_fail_behind_transaction_pooling(dsns):
    # Stores at once, so PgBouncer hands their transactions to different server connections:
    # a statement prepared on one is missing on the next.
    bounced, _ = dsns
    errors: List[str] = []

    def client() -> None:
        try:
            use(PostgresStore(bounced, pool_size=1), 6)
        except LogError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors, "every store worked with named statements behind transaction pooling"
    assert all("prepared statement" in e for e in errors), errors


def test_many_stores_at_once_work_with_unnamed_statements(dsns):
    results: List[List[str]] = []
    failures: List[BaseException] = []

    def client() -> None:
        try:
            results.append(use(bounced_store(dsns, pool_size=2), 6))
        except BaseException as e:  # reported below, with the others
            failures.append(e)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    ids = [i for r in results for i in r]
    assert len(ids) == 48
    listed = set(bounced_store(dsns).list())
    assert set(ids) <= listed
    staged = {row["id"]: row["staged"] for row in bounced_store(dsns).sessions()}
    assert all(staged[i] == 1 for i in ids)


def test_an_agent_loop_turn_runs_through_transaction_pooling(dsns):
    store = bounced_store(dsns)
    log = store.create()

    async def turn():
        loop = AgentLoop(EchoModel(), log=log)
        loop.followup("hello through pgbouncer")
        await loop.when_idle()
        await loop.aclose()
        await log.aclose()

    run(turn())
    reopened = bounced_store(dsns).open(log.id)
    assert [e.type for e in reopened].count("assistant/message") == 1
    reopened.close()


async def listening(prefix: str) -> None:
    """Waits until a LISTEN connection of this process has run a LISTEN on a `prefix` channel."""
    app = f"kerman-listen-{os.getpid()}"
    for _ in range(int(DEADLINE / 0.01)):
        if psql(f"SELECT 1 FROM pg_stat_activity WHERE application_name = '{app}' AND query LIKE 'LISTEN {prefix}%'"):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no LISTEN {prefix}... on the direct connection")


def test_followers_and_enqueue_wake_ups_use_the_direct_listen_dsn(dsns):
    owner, web = bounced_store(dsns), bounced_store(dsns)
    log = owner.create()
    follower = bounced_store(dsns).follow(log.id)

    async def scenario() -> List[str]:
        loop = AgentLoop(EchoModel(), log=log)
        seen: List[str] = []
        done = asyncio.Event()

        running = asyncio.get_running_loop()

        def on_event(e) -> None:  # on the store's reply thread
            seen.append(e.type)
            if e.type == "turn/end":
                running.call_soon_threadsafe(done.set)

        follower.subscribe(on_event)
        # Both LISTENs are up (on the server directly) before the enqueue: only its NOTIFY can
        # start this turn, and only the follower's notifications can tell it the turn ended.
        await listening("kerman_e_")
        await listening("kerman_a_")
        web.enqueue(log.id, "from the web")
        await asyncio.wait_for(done.wait(), DEADLINE)
        await loop.aclose()
        return seen

    seen = run(scenario())
    assert "user/message" in seen and "assistant/message" in seen
    follower.close()
    log.close()


def test_a_worker_takes_and_runs_enqueued_input_through_transaction_pooling(dsns):
    web = bounced_store(dsns)
    maker = bounced_store(dsns)
    ids = []
    for _ in range(3):
        log = maker.create()
        ids.append(log.id)
        log.close()
    worker = Worker(bounced_store(dsns), lambda log: AgentLoop(EchoModel(), log=log), idle_timeout=0.2)

    async def scenario() -> None:
        running = asyncio.ensure_future(worker.run())
        for i in ids:
            web.enqueue(i, f"for {i}")
        while True:
            rows = {r["id"]: r for r in web.sessions() if r["id"] in ids}
            if all(r["staged"] == 0 and r["owner"] is None for r in rows.values()) and len(rows) == len(ids):
                done = [bounced_store(dsns, pool_size=1).follow(i) for i in ids]
                if all(any(e.type == "assistant/message" for e in d) for d in done):
                    break
            await asyncio.sleep(0.05)
        worker.stop()
        await running

    run(scenario())
    for i in ids:
        texts = [e.data["content"][0]["text"] for e in bounced_store(dsns, pool_size=1).follow(i).events(types="user/message")]
        assert texts == [f"for {i}"]


def test_kerman_worker_runs_through_transaction_pooling_with_its_flags(dsns):
    """``kerman worker`` with ``--no-prepared-statements --listen-dsn`` (and ``--pool-size``) is
    what `kerman.Worker` over such a store is: it takes enqueued input, runs it, drains on
    SIGTERM."""
    from postgres.test_worker import WorkerProc

    bounced, direct = dsns
    web = bounced_store(dsns)
    log = web.create()
    log.close()
    worker = WorkerProc(bounced, "echo", "--no-prepared-statements", "--listen-dsn", direct, "--pool-size", "2", "--idle-timeout", "30")
    try:
        sent = web.enqueue(log.id, "through the bouncer")
        worker.wait_line(lambda line: line.startswith(f"model {log.id} ") and sent.id in line, "the model call")
        assert worker.signal(signal.SIGTERM) == 0
    finally:
        worker.close()
    texts = [e.data["content"][0]["text"] for e in PostgresStore(direct).follow(log.id).events(types="user/message")]
    assert texts == ["through the bouncer"]
