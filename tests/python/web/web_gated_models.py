"""The served model of test_browser_unread.py: ``web_models``' loop with a ``pre_step`` plugin
that holds a batch holding "wait at the door" (each message once, as an approval would) until the
turn is cancelled, so a test can cancel between the claim and the entry."""

from __future__ import annotations

import asyncio

from web_models import PATIENCE
from web_models import factory as plain_factory

import kerman

GATED: set = set()  # ids held once (kept across loops: the server may build the loop again)


def factory(log: kerman.SessionLog) -> kerman.AgentLoop:
    loop = plain_factory(log)

    @loop.pre_step
    async def door(step, next):  # noqa: ANN001, ANN202
        held = [m.id for m in step.messages if m.text == "wait at the door" and m.id not in GATED]
        if held:
            GATED.update(held)
            await asyncio.sleep(PATIENCE)  # until the turn is cancelled
        return await next()

    return loop
