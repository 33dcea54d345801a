"""The factory of the distributed benchmark's workers (benches/python/pg_workers.py), run as
``kerman worker DSN --app pg_workers_app:factory`` with this folder as the working directory.

The model is scripted: it waits ``BENCH_MODEL_DELAY`` seconds (default 0.005) and echoes. Each
fact the benchmark measures is one stdout line with ``time.time_ns()``:

- ``t <session> <ns>`` when the worker builds a session's loop (it took the session);
- ``m <ns> <message-id>...`` when the model is called, with the ids it entered;
- ``g <generation> <ns> <ms>`` after each garbage collection that took 5 ms or more (a pause
  of every session of the worker).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time

from kerman import AgentLoop, ModelReply

DELAY = float(os.environ.get("BENCH_MODEL_DELAY", "0.005"))
_write = sys.stdout.write


def _say(line: str) -> None:
    _write(line + "\n")
    sys.stdout.flush()


_gc_started = 0


def _on_gc(phase, info):
    global _gc_started
    if phase == "start":
        _gc_started = time.perf_counter_ns()
    elif _gc_started:
        took = (time.perf_counter_ns() - _gc_started) / 1e6
        if took >= 5:
            _say(f"g {info['generation']} {time.time_ns()} {took:.1f}")


gc.callbacks.append(_on_gc)


async def _model(request):
    _say(f"m {time.time_ns()} " + " ".join(m.id for m in request.entered))
    await asyncio.sleep(DELAY)
    return ModelReply("ok")


def factory(log) -> AgentLoop:
    _say(f"t {log.id} {time.time_ns()}")
    return AgentLoop(_model, log=log)
