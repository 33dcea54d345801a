"""LISTEN-driven tail latency of the PostgreSQL store (issue 6): an event appended and flushed in
this process, seen by a read-only follower's ``tail()`` in another process.

    python3 benches/python/pg_tail.py [N]             # prints one JSON line of figures
    python3 benches/python/pg_tail.py follow DSN ID N  # the follower child (used by the above)

The server is ``KERMAN_PG_DSN`` (``scripts/pg-test-server.sh`` starts a throwaway one). One
event at a time: append, ``await flush()`` (the commit), then wait for the follower's line for
that seq, so each sample is a full commit -> NOTIFY -> catch-up read -> tail round. Both
processes stamp with ``time.time_ns()`` (one machine, one clock).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

import kerman


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]


async def follow(dsn: str, id: str, n: int) -> None:
    log = kerman.PostgresStore(dsn).follow(id)
    print("ready", flush=True)
    async for event in log.tail(start=len(log)):
        print(event.seq, time.time_ns(), flush=True)
        if event.seq >= n - 1:
            break
    log.close()


async def measure(dsn: str, n: int) -> Dict[str, Any]:
    store = kerman.PostgresStore(dsn)
    log = store.create()
    child = subprocess.Popen([sys.executable, __file__, "follow", dsn, log.id, str(n)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    read = child.stdout.readline
    try:
        assert (await asyncio.to_thread(read)).strip() == "ready"
        commit: List[float] = []
        seen: List[float] = []
        for i in range(n):
            t0 = time.time_ns()
            log.append("bench/tick", {"i": i})
            await log.flush()
            t1 = time.time_ns()
            seq, stamp = (await asyncio.wait_for(asyncio.to_thread(read), 30)).split()
            assert int(seq) == i, (seq, i)
            commit.append((t1 - t0) / 1e6)
            seen.append((int(stamp) - t0) / 1e6)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
        log.close()
        store.delete(log.id)
    return {
        "n": n,
        "commit_p50_ms": statistics.median(commit),
        "tail_p50_ms": statistics.median(seen),
        "tail_p99_ms": pct(seen, 0.99),
    }


def main(argv: List[str]) -> int:
    if len(argv) > 1 and argv[1] == "follow":
        asyncio.run(follow(argv[2], argv[3], int(argv[4])))
        return 0
    dsn = os.environ.get("KERMAN_PG_DSN", "")
    if not dsn:
        print("KERMAN_PG_DSN is unset (scripts/pg-test-server.sh starts a server)", file=sys.stderr)
        return 2
    n = int(argv[1]) if len(argv) > 1 else 300
    print(json.dumps(asyncio.run(measure(dsn, n))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
