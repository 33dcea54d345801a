"""What TLS costs the PostgreSQL store, and what one connection per store gives many callers.

Usage: python scripts/pg-conn-bench.py DSN [TLS_DIR]
  DSN: a server of scripts/pg-test-server.sh (it serves TLS); TLS_DIR: its <data>/kerman-tls
  (default: read from the server with `SHOW ssl_ca_file`).

Prints, for sslmode=disable, require and verify-full:
* connect: the median time of `PostgresStore(dsn)` (TCP, TLS handshake, startup, the schema
  check), over 15 stores;
* request: the median of 2,000 sequential `exists()` calls (one round trip each);
* append: appends per second, one event per transaction (append, await its flush, repeat);
and then, plain only, 8 threads each making 300 `exists()` calls through one shared store and
through a store each (one store's pool, `pool_size` 4, against eight stores; scripts/pg-pool-bench.py
varies the pool size), and
the number of server connections each store holds (from `pg_stat_activity`).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import threading
import time
import uuid
from typing import Callable, List

import kerman


def psql(dsn: str, sql: str) -> List[str]:
    out = subprocess.run(["psql", dsn, "-XAtqc", sql], check=True, capture_output=True, text=True).stdout
    return out.split()


def with_params(dsn: str, **params: str) -> str:
    sep = "&" if "?" in dsn else "?"
    return dsn + sep + "&".join(f"{k}={v}" for k, v in params.items())


def timed(f: Callable[[], object]) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


async def appends(log: kerman.SessionLog, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        log.append("bench/e", {"i": i})
        await log.flush()
    return n / (time.perf_counter() - t)


def per_mode(dsn: str) -> str:
    connects = []
    for _ in range(15):
        connects.append(timed(lambda: kerman.PostgresStore(dsn)))
    store = kerman.PostgresStore(dsn)
    requests = [timed(lambda: store.exists("nope")) for _ in range(2000)]
    log = store.create()
    rate = asyncio.run(appends(log, 1000))
    log.close()
    return f"connect {statistics.median(connects) * 1000:.1f} ms, request {statistics.median(requests) * 1e6:.0f} µs, {rate:.0f} appends/s"


def threads(stores: List[kerman.PostgresStore], calls: int) -> float:
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


def main() -> None:
    dsn = sys.argv[1]
    tls = sys.argv[2] if len(sys.argv) > 2 else psql(dsn, "SHOW ssl_ca_file")[0].rsplit("/", 1)[0]
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    psql(dsn, f"CREATE SCHEMA {schema}")
    base = with_params(dsn, options=f"-csearch_path%3D{schema}")
    host_port = base.split("@", 1)[1].split("/", 1)[0]
    modes = {
        "disable": with_params(base, sslmode="disable"),
        "require": with_params(base, sslmode="require"),
        "verify-full": with_params(
            base.replace(host_port, "localhost:" + host_port.rsplit(":", 1)[1]),
            sslmode="verify-full",
            sslrootcert=f"{tls}/ca.crt",
            hostaddr="127.0.0.1",
        ),
    }
    for mode, d in modes.items():
        print(f"{mode:12} {per_mode(d)}", flush=True)
    plain = modes["disable"]
    shared = kerman.PostgresStore(plain)
    one = threads([shared] * 8, 300)
    eight = threads([kerman.PostgresStore(plain) for _ in range(8)], 300)
    print(f"8 threads, exists(): one shared store {one:.0f}/s, a store each {eight:.0f}/s")
    name = f"bench_{uuid.uuid4().hex[:8]}"
    store = kerman.PostgresStore(with_params(plain, application_name=name))
    logs = [store.create() for _ in range(50)]
    count = lambda: psql(dsn, f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}'")[0]  # noqa: E731
    before = count()
    followers = [store.follow(log.id) for log in logs[:10]]
    store.list()
    listen = psql(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'kerman-listen-%'")[0]
    print(
        f"connections of one store holding 50 sessions: {before}; with 10 followers: {count()} "
        f"+ LISTEN connections of this process: {listen}"
    )
    for f in followers:
        f.close()
    for log in logs:
        log.close()
    psql(dsn, f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
