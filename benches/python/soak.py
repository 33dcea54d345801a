#!/usr/bin/env python3
"""Memory soak: many sessions created, run one turn each, closed and dropped, in one process.

    python3 benches/python/soak.py SESSIONS FILE_SESSIONS DIR

Three phases, each measured as the resident set size at its end against the size after its
first 1,000 sessions (a third of the file sessions, 20 large ones), so start-up and the
allocator's first growth are not counted:

* ``memory``: ``SESSIONS`` loops over private memory logs (``async with AgentLoop(model)``);
* ``file``: ``FILE_SESSIONS`` loops over file sessions in ``DIR`` (durability ``none``), each
  log opened with ``with store.create(id) as log:`` and deleted after (creating a session
  file syncs it and its folder, whatever the durability: this phase is bound by the disk);
* ``large``: 200 loops whose prompt is 1 MB (a leak of the session would hold 200 MB).

Prints one JSON line: for each phase, RSS in bytes after the warm-up and at the end.
Run in a process of its own (bench.py does), so nothing else shares the heap.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
from typing import Any, Callable, Dict

import kerman

WARMUP = 1_000
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
    return kerman.ModelReply("ok")


async def one_turn(prompt: str, log: Any = None) -> None:
    async with kerman.AgentLoop(model, log=log) as loop:
        loop.followup(prompt)
        await loop.when_idle()


async def phase(n: int, warmup: int, run_one: Callable[[int], Any]) -> Dict[str, int]:
    after_warmup = 0
    for i in range(n):
        await run_one(i)
        if i + 1 == warmup:
            after_warmup = rss()
    return {"sessions": n, "rss_after_warmup": after_warmup, "rss_end": rss()}


async def main(sessions: int, file_sessions: int, root: str) -> Dict[str, Any]:
    store = kerman.FileStore(root, durability="none")

    async def on_file(i: int) -> None:
        with store.create(f"s-{i}") as log:
            await one_turn("hello", log)
        store.delete(f"s-{i}")

    large = "x" * 1_000_000
    return {
        "memory": await phase(sessions, WARMUP, lambda i: one_turn("hello")),
        "file": await phase(file_sessions, min(WARMUP, file_sessions // 3), on_file),
        "large": await phase(200, 20, lambda i: one_turn(large)),
    }


if __name__ == "__main__":
    n, files, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    print(json.dumps(asyncio.run(main(n, files, root))))
