"""A process that appends to a KermanSession until it is killed (test_session_crash.py).

    python session_writer_child.py file ROOT SESSION
    python session_writer_child.py postgres DSN SESSION

Each ``add_items`` call adds a pair (a large user item, an assistant item naming the same
batch); the batch number is printed once ``add_items`` returned (the append is durable).
"""

from __future__ import annotations

import asyncio
import sys

import kerman
from kerman.integrations.openai_agents import KermanSession

PAD = "x" * 200_000  # large records: a kill is likely to land inside one's write


async def main(kind: str, where: str, session_id: str) -> None:
    store = kerman.FileStore(where, durability="checkpoint") if kind == "file" else kerman.PostgresStore(where)
    session = KermanSession(store, session_id)
    batch = 0
    while True:
        await session.add_items([{"role": "user", "content": f"{batch} {PAD}"}, {"role": "assistant", "content": str(batch)}])
        print(batch, flush=True)
        batch += 1


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
