"""A PostgresStore's pool of connections (issue 17, item 3): ``PostgresStore(dsn, pool_size=N)``
opens at most N connections for its requests (the first at once, another only when that many
requests are in flight together), each visible in ``pg_stat_activity`` under the store's
``application_name``; a request stuck on a row lock does not hold up another session's append;
a session's appends and its release keep their order; bad sizes are refused naming the value."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
import uuid

import pytest

from conftest import PG_DSN as DSN
from conftest import needs_postgres, psql
from kerman import PostgresStore

pytestmark = needs_postgres


def with_app(name: str) -> str:
    sep = "&" if "?" in DSN else "?"
    return f"{DSN}{sep}application_name={name}"


def backends(app: str, extra: str = "") -> int:
    return int(psql(f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}' {extra}")[0])


def await_lock_waits(app: str, n: int) -> None:
    deadline = time.monotonic() + 20
    while backends(app, "AND wait_event_type = 'Lock'") != n:
        assert time.monotonic() < deadline, f"never saw {n} of {app}'s requests wait on the lock"
        time.sleep(0.005)


class RowLocks:
    """A psql session holding ``FOR UPDATE`` locks on session rows until ``release()``."""

    def __init__(self, ids: list[str]) -> None:
        self.app = f"holder-{uuid.uuid4().hex[:8]}"
        self.proc = subprocess.Popen(
            ["psql", with_app(self.app), "-XAtq"], stdin=subprocess.PIPE, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        quoted = ", ".join(f"'{i}'" for i in ids)
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"BEGIN; SELECT 1 FROM kerman_sessions WHERE id IN ({quoted}) FOR UPDATE; SELECT pg_sleep(600);\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + 20
        while backends(self.app, "AND query LIKE '%pg_sleep%'") != 1:
            assert time.monotonic() < deadline, "psql never took the locks"
            time.sleep(0.005)

    def release(self) -> None:
        psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{self.app}'")
        self.proc.wait(timeout=30)
        assert self.proc.stdin is not None
        self.proc.stdin.close()


def free_sessions(n: int) -> list[str]:
    """n sessions nobody owns."""
    maker = PostgresStore(DSN, pool_size=1)
    ids = []
    for _ in range(n):
        log = maker.create(f"pool-{uuid.uuid4()}")
        ids.append(log.id)
        log.close()
    return ids


@pytest.mark.parametrize("bad", [0, -1, 65, 10**30])
def test_a_pool_size_out_of_range_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=rf"pool_size must be from 1 to 64, got {bad}"):
        PostgresStore(DSN, pool_size=bad)


@pytest.mark.parametrize("bad", [True, 2.0, "4", None])
def test_a_pool_size_that_is_not_an_int_is_a_type_error(bad):
    with pytest.raises(TypeError, match=rf"pool_size must be an int, got {bad!r}"):
        PostgresStore(DSN, pool_size=bad)


def test_the_pool_size_is_shown_and_defaults_to_four():
    assert PostgresStore(DSN).pool_size == 4
    store = PostgresStore(DSN, pool_size=2)
    assert store.pool_size == 2 and store.prepared_statements
    assert "pool_size=2" in repr(store)


def test_connections_open_as_requests_overlap_and_never_beyond_the_pool_size():
    ids = free_sessions(5)
    app = f"pool-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(with_app(app), pool_size=3)
    assert backends(app) == 1, "the constructor opens one connection"
    locks = RowLocks(ids)
    logs: list = []
    threads = [threading.Thread(target=lambda i=i: logs.append(store.open(i))) for i in ids]
    try:
        for t in threads:
            t.start()
        # Three opens wait on the locks, one per connection; the other two queue behind them.
        await_lock_waits(app, 3)
        assert backends(app) == 3
    finally:
        locks.release()
        for t in threads:
            t.join(timeout=60)
    assert len(logs) == 5 and backends(app) == 3
    for log in logs:
        log.close()


def test_a_request_stuck_on_a_row_lock_does_not_hold_up_another_sessions_append():
    [stuck] = free_sessions(1)
    app = f"pool-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(with_app(app), pool_size=2)
    log = store.create()
    locks = RowLocks([stuck])
    done: list = []
    opener = threading.Thread(target=lambda: done.append(store.open(stuck)))
    try:
        opener.start()
        await_lock_waits(app, 1)

        async def append():
            log.append("x/e", 1)
            await asyncio.wait_for(log.flush(), 60)

        asyncio.run(append())
        assert opener.is_alive() and not done, "the open was still waiting"
    finally:
        locks.release()
        opener.join(timeout=60)
    assert [e.data for e in PostgresStore(DSN).follow(log.id)] == [1]
    log.close()
    done[0].close()


def test_each_sessions_appends_and_release_keep_their_order_across_the_pool():
    store = PostgresStore(DSN, pool_size=4)
    logs = [store.create(f"order-{uuid.uuid4()}") for _ in range(16)]

    async def burst():
        for i in range(30):
            for log in logs:
                log.append("x/e", i)
        await asyncio.gather(*(asyncio.wait_for(log.flush(), 60) for log in logs))

    asyncio.run(burst())
    for log in logs:
        log.close()  # its release queues behind its appends
    other = PostgresStore(DSN, pool_size=1)
    for log in logs:
        reopened = other.open(log.id)  # released: free at once
        assert [e.data for e in reopened] == list(range(30))
        reopened.close()


def test_appends_across_the_pool_survive_its_backends_being_terminated():
    app = f"pool-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(with_app(app), pool_size=3)
    logs = [store.create(f"kill-{uuid.uuid4()}") for _ in range(6)]
    n = 40
    progress = [0] * len(logs)

    def writer(k: int) -> None:
        async def go():
            for i in range(n):
                logs[k].append("x/e", i)
                await asyncio.wait_for(logs[k].flush(), 60)
                progress[k] = i + 1

        asyncio.run(go())

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(len(logs))]
    for t in threads:
        t.start()
    killed = 0
    for threshold in (n, 2 * n, 3 * n):
        deadline = time.monotonic() + 60
        while sum(progress) < threshold:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        killed += len(psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{app}'"))
    for t in threads:
        t.join(timeout=120)
    assert killed >= 3 and progress == [n] * len(logs)
    reader = PostgresStore(DSN, pool_size=1)
    for log in logs:
        assert [e.data for e in reader.follow(log.id)] == list(range(n)), "each append exactly once"
        log.close()
