"""Child programs for the multi-process PostgreSQL tests (test_postgres_distributed.py) and
the tail-latency bench row. Not a test module.

Usage: ``python pg_child.py <mode> <dsn> <session-id> [args...]``. Every child writes one line
per fact to stdout (flushed), so the parent synchronises on lines, never on sleeps:

- ``follow <dsn> <id> <n>``: ``ready`` once following, then ``e <seq> <type> <data-json>`` per
  event (the ones already stored, then live ones through ``tail()``) until it has seen ``n``
  events, then ``done``.
- ``stamps <dsn> <id> <n>``: like ``follow`` but prints ``t <seq> <time.time_ns()>`` as each
  event reaches the tail (for the latency bench).
- ``enqueue <dsn> <id> <k> <prefix>``: enqueues ``k`` messages ``<prefix>-<i>``, printing
  ``q <message-id>`` after each.
- ``producer <dsn> -``: a long-lived producer for the ordering property: reads lines
  ``<session-id> <wakeup 0|1> <target>,<target>,...`` from stdin and enqueues one message per
  target, back to back, then prints ``q <message-id>...`` (all of them, in enqueue order).
- ``worker <dsn> <id> <label>``: contends for the session until stdin closes: opens it (retrying
  while another worker holds it), runs an ``AgentLoop`` (echo model) until it is idle with an
  empty inbox after a short hold, closes it, and again. Prints ``open <epoch-ish count>`` per
  ownership and ``claimed <message-id>`` per claimed message.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

from kerman import AgentLoop, PostgresStore, SessionLockedError
from kerman.models import EchoModel


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


async def follow(dsn: str, id: str, n: int, stamps: bool) -> None:
    log = PostgresStore(dsn).follow(id)
    say("ready")
    seen = 0
    async for event in log.tail():
        if stamps:
            say("t", event.seq, time.time_ns())
        else:
            say("e", event.seq, event.type, json.dumps(event.data, separators=(",", ":")))
        seen += 1
        if seen >= n:
            break
    log.close()
    say("done")


def enqueue(dsn: str, id: str, k: int, prefix: str) -> None:
    store = PostgresStore(dsn)
    for i in range(k):
        message = store.enqueue(id, f"{prefix}-{i}")
        say("q", message.id)


def producer(dsn: str) -> None:
    store = PostgresStore(dsn)
    for line in sys.stdin:
        id, wakeup, targets = line.split()
        ids = [store.enqueue(id, f"m{i}", target=t, wakeup=wakeup == "1").id for i, t in enumerate(targets.split(","))]
        say("q", *ids)


async def worker(dsn: str, id: str, label: str) -> None:
    store = PostgresStore(dsn, lease_ttl=5.0)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    rounds = 0
    while not stop.is_set():
        try:
            log = store.open(id)
        except SessionLockedError:
            await asyncio.sleep(0.005)  # back off while the other worker holds the lease
            continue
        rounds += 1
        say("open", label, rounds)
        loop = AgentLoop(EchoModel(), log=log)
        arrived = asyncio.Event()
        # Each round's loop has its own listener and event: the listener never sees a later one (B023).
        loop.on("agent/inbox/claimed", lambda e: (say("claimed", e.message.id), arrived.set()))  # noqa: B023
        loop.wake()
        # Hold the lease a moment so staged input has a chance to arrive here, then drain.
        try:
            await asyncio.wait_for(arrived.wait(), 0.1)
        except asyncio.TimeoutError:
            pass
        # Close only when idle with nothing pending, checked with no await before close():
        # a wake scheduled meanwhile (input arriving from the enqueuer) runs at an await, so
        # this never closes the log under a running turn. Input inserted by the store's
        # thread after the check is committed by close() and claimed by the next owner.
        while True:
            await loop.when_idle()
            await log.flush()
            if loop.status == "idle" and not loop.inbox.has_pending:
                break
            loop.wake()
        log.close()
    say("stopped", label)


def main(argv: list[str]) -> None:
    mode, dsn, id = argv[1], argv[2], argv[3]
    if mode in ("follow", "stamps"):
        asyncio.run(follow(dsn, id, int(argv[4]), mode == "stamps"))
    elif mode == "enqueue":
        enqueue(dsn, id, int(argv[4]), argv[5])
    elif mode == "producer":
        producer(dsn)
    elif mode == "worker":
        asyncio.run(worker(dsn, id, argv[4]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)
