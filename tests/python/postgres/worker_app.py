"""Factories for the worker tests (test_worker*.py), run by real ``kerman worker`` processes
(``--app worker_app:echo``, with this folder as the working directory). Not a test module.

Every fact a test synchronises on is one flushed stdout line, never a sleep:

- ``took <session> <pid>`` when the factory builds a session's loop (the worker took it);
- ``model <session> <pid> <message-id>...`` when the model is called, with the ids it entered;
- ``pre <session> <pid>`` when the ``hang`` factory's pre_step starts waiting;
- ``frozen <n>`` from the ``frozen`` factory: how many objects ``gc.freeze()`` holds.

Environment: ``WORKER_APP_DELAY`` (seconds the model waits before replying, default 0),
``WORKER_APP_FAIL=1`` (the model raises: every turn fails), ``WORKER_APP_HANG=<session>,...`` (the
``hang`` factory's pre_step never returns in the sessions named: the turn claims its input and
waits forever; the other sessions' turns run on).
"""

from __future__ import annotations

import asyncio
import os
import sys

from kerman import AgentLoop, ModelError, ModelReply


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def _model(session: str):
    delay = float(os.environ.get("WORKER_APP_DELAY", "0"))
    fail = os.environ.get("WORKER_APP_FAIL") == "1"

    async def model(request):
        say("model", session, os.getpid(), *[m.id for m in request.entered])
        if delay:
            await asyncio.sleep(delay)
        if fail:
            raise ModelError("the scripted model fails every turn")
        return ModelReply("\n".join(m.text for m in request.entered))

    return model


def echo(log) -> AgentLoop:
    say("took", log.id, os.getpid())
    return AgentLoop(_model(log.id), log=log)


def hang(log) -> AgentLoop:
    say("took", log.id, os.getpid())
    loop = AgentLoop(_model(log.id), log=log)
    if log.id in os.environ.get("WORKER_APP_HANG", "").split(","):

        @loop.pre_step
        async def wait_forever(step, next):
            await log.flush()  # the claim is durable: only requeue_claimed brings it back
            say("pre", log.id, os.getpid())
            await asyncio.Event().wait()

    return loop


async def built_async(log) -> AgentLoop:
    """An async factory."""
    await asyncio.sleep(0)
    return echo(log)


def broken(log) -> AgentLoop:
    say("took", log.id, os.getpid())
    raise RuntimeError("the factory cannot build this session")


def frozen(log) -> AgentLoop:
    """Says how many objects the worker froze out of the collector's sight at start."""
    import gc

    say("frozen", gc.get_freeze_count())
    return echo(log)
