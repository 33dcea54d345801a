"""What a store's pool of connections gives many callers, and what unnamed statements cost.

Usage: python scripts/pg-pool-bench.py DSN [BOUNCER_DSN]
  DSN: the test server (scripts/pg-test-server.sh); BOUNCER_DSN: the same database through a
  transaction-pooling PgBouncer (scripts/pgbouncer-test.sh start), optional.

Prints, each from one run:
* connect: the median of `PostgresStore(dsn)` over 15 stores, for pool sizes 1 and 4 (the
  pool opens its other connections on demand, so the constructor opens one either way);
* 8 threads each making 300 `exists()` calls through one shared store with pool_size 1, 2, 4
  and 8, and through a store each;
* appends per second across 64 sessions of one store (each session: append one event, await its
  flush, repeat; all sessions at once on one asyncio loop), pool_size 1, 2, 4;
* one session's sequential appends per second and `exists()` round trip, with named prepared
  statements and with `prepared_statements=False` (and through PgBouncer when given).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from typing import List

import kerman


def psql(dsn: str, sql: str) -> List[str]:
    return subprocess.run(["psql", dsn, "-XAtqc", sql], check=True, capture_output=True, text=True).stdout.split()


def with_params(dsn: str, **params: str) -> str:
    sep = "&" if "?" in dsn else "?"
    return dsn + sep + "&".join(f"{k}={v}" for k, v in params.items())


def exists_threads(stores: List[kerman.PostgresStore], calls: int) -> float:
    def work(store: kerman.PostgresStore) -> None:
        for _ in range(calls):
            store.exists("nope")

    ts = [threading.Thread(target=work, args=(s,)) for s in stores]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return len(stores) * calls / (time.perf_counter() - t)


async def many_sessions(store: kerman.PostgresStore, sessions: int, each: int) -> float:
    logs = [store.create() for _ in range(sessions)]

    async def one(log: kerman.SessionLog) -> None:
        for i in range(each):
            log.append("bench/e", {"i": i})
            await log.flush()

    t = time.perf_counter()
    await asyncio.gather(*(one(log) for log in logs))
    rate = sessions * each / (time.perf_counter() - t)
    for log in logs:
        log.close()
    return rate


async def sequential(store: kerman.PostgresStore, n: int) -> float:
    log = store.create()
    t = time.perf_counter()
    for i in range(n):
        log.append("bench/e", {"i": i})
        await log.flush()
    rate = n / (time.perf_counter() - t)
    log.close()
    return rate


def round_trip(store: kerman.PostgresStore) -> float:
    times = []
    for _ in range(2000):
        t = time.perf_counter()
        store.exists("nope")
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    dsn = sys.argv[1]
    bouncer = sys.argv[2] if len(sys.argv) > 2 else None
    print(f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    psql(dsn, f"CREATE SCHEMA {schema}")
    base = with_params(dsn, options=f"-csearch_path%3D{schema}")
    for size in (1, 4):
        connects = []
        for _ in range(15):
            t = time.perf_counter()
            kerman.PostgresStore(base, pool_size=size)
            connects.append(time.perf_counter() - t)
        print(f"connect, pool_size={size}: {statistics.median(connects) * 1000:.1f} ms", flush=True)
    shared = {size: exists_threads([kerman.PostgresStore(base, pool_size=size)] * 8, 300) for size in (1, 2, 4, 8)}
    each = exists_threads([kerman.PostgresStore(base, pool_size=1) for _ in range(8)], 300)
    print(
        "8 threads, exists(): one shared store "
        + ", ".join(f"pool {k}: {v:.0f}/s" for k, v in shared.items())
        + f"; a store each: {each:.0f}/s",
        flush=True,
    )
    for size in (1, 2, 4):
        rate = asyncio.run(many_sessions(kerman.PostgresStore(base, pool_size=size), 64, 40))
        print(f"appends/s across 64 sessions, pool_size={size}: {rate:.0f}", flush=True)
    targets = [("direct, named", base, True), ("direct, unnamed", base, False)]
    if bouncer:
        targets.append(("pgbouncer, unnamed", bouncer, False))
    for name, d, named in targets:
        store = kerman.PostgresStore(d, prepared_statements=named, pool_size=1)
        rate = asyncio.run(sequential(store, 1000))
        print(f"{name}: {rate:.0f} sequential appends/s, exists() {round_trip(store):.0f} µs", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    psql(dsn, f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
