"""A process of its own over a session (a FileStore folder's, or a PostgreSQL DSN's), for the
tests of this folder.

``ROOT SID COUNTER TOOL``: the first turn of session SID (created) asks for one call of TOOL,
whose body appends ``{"tool", "key"}`` to COUNTER, prints ``IN_BODY`` and hangs until the
parent kills the process with SIGKILL. ``ROOT SID COUNTER resume``: opens the session and
resumes it, with bodies that hang the same way. The tools are ``in_doubt_tools.build``'s.
"""

from __future__ import annotations

import asyncio
import sys

from in_doubt_tools import build

from kerman import FileStore, ModelReply, PostgresStore


async def main(root: str, sid: str, counter: str, tool: str) -> None:
    # ROOT may be a PostgreSQL DSN: a short lease, so another process takes over soon after the kill.
    store = PostgresStore(root, lease_ttl=1.0) if root.startswith("postgres") else FileStore(root, durability="strict")
    log = store.open(sid) if tool == "resume" else store.create(sid)

    async def model(request):
        return ModelReply([{"type": "tool-call", "id": "c1", "name": tool, "arguments": '{"n": 1}'}])

    hang = asyncio.Event()
    loop = build(model, log, counter, hang)
    if tool == "resume":
        loop.wake()
    else:
        loop.followup("go")
    await loop.when_idle()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
