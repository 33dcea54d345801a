"""Child program for tests/python/postgres/test_postgres_takeover.py. Not a test module.

Usage: ``python pg_takeover_child.py <mode> <dsn> <session-id> <lease-ttl>``

Talks to the parent in lines: it writes what it did to stdout, and waits for ``go`` on stdin
where the parent must act first (never a sleep).

``stale``: creates the session, appends ``a0`` and ``a1`` and flushes, writes ``ready``, then
waits for ``go`` (the parent stops it with SIGSTOP meanwhile, lets the lease lapse and takes the
session over). It then appends ``a-late`` and flushes; a lease-lost flush writes
``flush LeaseLostError``, and a further append ``append LeaseLostError`` (anything else: the
exception's name, or ``ok``). Exits 0.

``drop``: with a 30 s lease, creates the session, appends ``d0`` and ``d1``, drops the log
without closing it (the store lives on), writes ``dropped`` and waits for ``go`` before exiting.

``model`` / ``tool``: runs an AgentLoop on the session. In ``model`` mode the model, on its
first request, awaits forever; in ``tool`` mode it asks for the tool ``wait``, whose body
awaits forever. Before awaiting, the model (or tool body) flushes the log and writes
``waiting <n>`` followed by the ``n`` flushed events' JSON, one per line, then ``end``. The
parent SIGKILLs it there.
"""

from __future__ import annotations

import asyncio
import gc
import sys

import kerman


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def stale(dsn: str, session_id: str, ttl: float) -> None:
    store = kerman.PostgresStore(dsn, lease_ttl=ttl)
    log = store.create(session_id)

    async def flush() -> str:
        try:
            await log.flush()
        except Exception as e:  # noqa: BLE001 - reported to the parent by name
            return type(e).__name__
        return "ok"

    log.append("x/e", "a0")
    log.append("x/e", "a1")
    say("flush " + asyncio.run(flush()))
    say("ready")
    assert sys.stdin.readline().strip() == "go"
    try:
        log.append("x/e", "a-late")
    except Exception as e:  # noqa: BLE001
        say("append-late " + type(e).__name__)
    say("flush " + asyncio.run(flush()))
    try:
        log.append("x/e", "a-later")
        say("append ok")
    except Exception as e:  # noqa: BLE001
        say("append " + type(e).__name__)


def drop(dsn: str, session_id: str) -> None:
    store = kerman.PostgresStore(dsn, lease_ttl=30.0)
    log = store.create(session_id)
    log.append("x/e", "d0")
    log.append("x/e", "d1")
    del log
    gc.collect()
    say("dropped")
    assert sys.stdin.readline().strip() == "go"
    assert store.exists(session_id)


async def mid_turn(mode: str, dsn: str, session_id: str, ttl: float) -> None:
    store = kerman.PostgresStore(dsn, lease_ttl=ttl)
    log = store.create(session_id)
    forever = asyncio.Event()

    async def report_and_wait() -> None:
        await log.flush()
        events = list(log)
        say(f"waiting {len(events)}")
        for event in events:
            say(event.to_json())
        say("end")
        await forever.wait()

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        if mode == "model":
            await report_and_wait()
        return kerman.ModelReply(
            [
                {"type": "text", "text": "calling wait"},
                {"type": "tool-call", "id": "c1", "name": "wait", "arguments": "{}"},
            ]
        )

    loop = kerman.AgentLoop(model, log=log)

    @loop.tool
    async def wait(args: dict, ctx: kerman.ToolContext) -> str:
        """Waits forever."""
        await report_and_wait()
        return "never"

    loop.followup("start a turn")
    await loop.when_idle()


def main() -> None:
    mode, dsn, session_id, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    if mode == "stale":
        stale(dsn, session_id, ttl)
    elif mode == "drop":
        drop(dsn, session_id)
    else:
        asyncio.run(mid_turn(mode, dsn, session_id, ttl))


if __name__ == "__main__":
    main()
