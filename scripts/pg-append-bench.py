"""Appends per second and write transactions per append for the PostgreSQL store.

Usage: python scripts/pg-append-bench.py [DSN]   (default: $KERMAN_PG_DSN)

Two shapes, each on a fresh session:
* sequential: append one event, await its flush, repeat (one transaction per append: the
  latency of one append round trip);
* burst: append N events without waiting, then flush once (group commit packs the rows queued
  while a transaction is in flight into the next one);
* sessions: 50 sessions of one store (so one connection), each appending sequentially as
  above, all at once: what one store's single in-order connection gives many sessions.

Write transactions are counted as the growth of `pg_current_xact_id()` (every committed or
aborted write transaction takes one xid), read with `psql`, so run it on a database nobody else
writes to meanwhile. Prints one line per shape.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import kerman


def xid(dsn: str) -> int:
    out = subprocess.run(["psql", dsn, "-Atc", "SELECT pg_current_xact_id()"], check=True, capture_output=True, text=True).stdout
    return int(out.strip())


async def sequential(log: kerman.SessionLog, n: int) -> None:
    for i in range(n):
        log.append("bench/e", {"i": i, "text": "x" * 200})
        await log.flush()


async def burst(log: kerman.SessionLog, n: int) -> None:
    for i in range(n):
        log.append("bench/e", {"i": i, "text": "x" * 200})
    await log.flush()


async def sessions(logs: list, n: int) -> None:
    await asyncio.gather(*(sequential(log, n // len(logs)) for log in logs))


def measure(dsn: str, name: str, shape, n: int, count: int = 1) -> None:
    store = kerman.PostgresStore(dsn)
    logs = [store.create() for _ in range(count)]
    before = xid(dsn)
    start = time.perf_counter()
    asyncio.run(shape(logs[0] if count == 1 else logs, n))
    elapsed = time.perf_counter() - start
    # One xid for our own psql probe is subtracted.
    txs = xid(dsn) - before - 1
    for log in logs:
        log.close()
        store.delete(log.id)
    print(f"{name:10} {n:6} appends  {n / elapsed:9.0f} appends/s  {txs:5} write transactions")


def main() -> None:
    dsn = sys.argv[1] if len(sys.argv) > 1 else os.environ["KERMAN_PG_DSN"]
    measure(dsn, "sequential", sequential, 2000)
    measure(dsn, "burst", burst, 20000)
    measure(dsn, "sessions", sessions, 5000, count=50)


if __name__ == "__main__":
    main()
