"""The model ``benches/python/web_sse.py`` serves: ``stream N PACE_MS`` streams N text chunks, one
every PACE_MS milliseconds, each carrying the wall-clock time it was made (``time.time_ns()``),
so a client on the same machine can tell how long it took to reach it."""

from __future__ import annotations

import asyncio
import time

import kerman


async def model(request: kerman.ModelRequest):  # noqa: ANN201
    words = (request.entered[-1].text if request.entered else "").split()
    count, pace = (int(words[1]), float(words[2]) / 1000) if len(words) == 3 and words[0] == "stream" else (1, 0.0)
    for _ in range(count):
        yield {"type": "text-delta", "text": f"{time.time_ns()} "}
        if pace:
            await asyncio.sleep(pace)


def factory() -> kerman.AgentLoop:
    return model
