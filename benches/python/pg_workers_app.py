"""The factory of the distributed benchmark's workers (benches/python/pg_workers.py), run as
``kerman worker DSN --app pg_workers_app:factory`` with this folder as the working directory.

The model is scripted: it waits ``BENCH_MODEL_DELAY`` seconds (default 0.005) and answers
``ok``, except that a step whose last message is a user message reading ``t`` first calls the
``note`` tool (a ``write`` tool, default ``on_in_doubt="fail"``), whose body appends its
idempotency key to ``BENCH_EFFECTS`` (a file, O_APPEND): the benchmark's count of executions.
Each fact the benchmark measures is one stdout line with ``time.time_ns()``:

- ``t <session> <ns>`` when the worker builds a session's loop (it took the session);
- ``m <ns> <message-id>...`` when the model is called, with the ids it entered;
- ``b <ns> <session> <pid>`` when a model call blocks for good: the first call to find
  ``BENCH_BLOCK_FILE`` claims it (unlinks it) and never returns, so the benchmark kills this
  worker inside a model call;
- ``g <generation> <ns> <ms>`` after each garbage collection that took 5 ms or more (a pause
  of every session of the worker).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time

from kerman import AgentLoop, ModelReply, Tool

DELAY = float(os.environ.get("BENCH_MODEL_DELAY", "0.005"))
BLOCK = os.environ.get("BENCH_BLOCK_FILE")
EFFECTS = os.environ.get("BENCH_EFFECTS")
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


def _claim_block() -> bool:
    """Whether this call is the one to block: exactly one caller, in any worker, unlinks it."""
    if not BLOCK:
        return False
    try:
        os.unlink(BLOCK)
    except FileNotFoundError:
        return False
    return True


def _model_of(session: str):
    async def model(request):
        _say(f"m {time.time_ns()} " + " ".join(m.id for m in request.entered))
        if _claim_block():
            _say(f"b {time.time_ns()} {session} {os.getpid()}")
            await asyncio.Event().wait()  # until the benchmark's SIGKILL
        await asyncio.sleep(DELAY)
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "user" and getattr(last, "text", None) == "t":
            call = {"type": "tool-call", "id": f"n{time.time_ns()}", "name": "note", "arguments": "{}"}
            return ModelReply([call])
        return ModelReply("ok")

    return model


async def _note(args, ctx):
    if EFFECTS:
        fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{ctx.idempotency_key}\n".encode())
        finally:
            os.close(fd)
    return "noted"


def factory(log) -> AgentLoop:
    _say(f"t {log.id} {time.time_ns()}")
    loop = AgentLoop(_model_of(log.id), log=log)
    loop.tool(Tool("note", _note, description="Notes something.", parameters={"type": "object", "properties": {}}))
    return loop
