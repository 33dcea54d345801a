"""The factory of the distributed benchmark's workers (benches/python/pg_workers.py), run as
``kerman worker DSN --app pg_workers_app:factory`` with this folder as the working directory.

The model is scripted: it waits ``BENCH_MODEL_DELAY`` seconds (default 0.005) and echoes. Each
fact the benchmark measures is one stdout line with ``time.time_ns()``:

- ``t <session> <ns>`` when the worker builds a session's loop (it took the session);
- ``m <ns> <message-id>...`` when the model is called, with the ids it entered.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from kerman import AgentLoop, ModelReply

DELAY = float(os.environ.get("BENCH_MODEL_DELAY", "0.005"))
_write = sys.stdout.write


def _say(line: str) -> None:
    _write(line + "\n")
    sys.stdout.flush()


async def _model(request):
    _say(f"m {time.time_ns()} " + " ".join(m.id for m in request.entered))
    await asyncio.sleep(DELAY)
    return ModelReply("ok")


def factory(log) -> AgentLoop:
    _say(f"t {log.id} {time.time_ns()}")
    return AgentLoop(_model, log=log)
