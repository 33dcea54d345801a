"""A guard plugin: a ``pre_step`` listener that rejects destructive prompts.

Before every step the loop claims the queued input as one batch and asks the ``pre_step``
waterfall for exactly one decision: ``Reject(reason)`` ends the turn ``blocked`` (the reason is
recorded in ``turn/end``) and nothing reaches the model; ``await next()`` lets the batch through
to the next listener and finally to the default, which enters it unchanged.

A packaged, tested version of this plugin is in ``examples/plugins/`` (docs/plugins.md).

Run it: ``python examples/guard_plugin.py``
"""

from __future__ import annotations

import asyncio
import re

import kerman
from kerman.models import EchoModel

DESTRUCTIVE = [
    (re.compile(r"\brm\s+-[a-z]*r[a-z]*f|\brm\s+-[a-z]*f[a-z]*r", re.I), "recursive forced delete (rm -rf)"),
    (re.compile(r"\bdrop\s+(table|database)\b", re.I), "dropping a table or database"),
    (re.compile(r"\bgit\s+push\b.*--force\b"), "force-pushing"),
]


def install_guard(loop: kerman.AgentLoop) -> None:
    """Registers the guard first (``prepend=True``), so it sees the batch before other plugins."""

    @loop.pre_step(prepend=True)
    async def guard(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
        for message in step.messages:
            for pattern, what in DESTRUCTIVE:
                if pattern.search(message.text):
                    return kerman.Reject(f"{what} needs a human: {message.text!r}")
        return await next()  # not destructive: let the rest of the waterfall decide


async def main() -> None:
    loop = kerman.AgentLoop(EchoModel())  # EchoModel replies with the entered text
    install_guard(loop)

    prompts = [
        "List the files in the build folder",
        "Free some space: rm -rf /var/lib/build",
        "DROP TABLE users; then rebuild",
        "Show the disk usage of the build folder",
    ]
    for prompt in prompts:
        loop.followup(prompt)
        await loop.when_idle()
        end = list(loop.log.events(types="turn/end"))[-1].data
        reason = end["reason"]
        if reason["kind"] == "blocked":
            print(f"turn {end['turn']}  blocked    {reason['reason']}")
        else:
            reply = list(loop.log.events(types="assistant/message"))[-1].data["message"]
            print(f"turn {end['turn']}  {reason['kind']:<10} the model saw {kerman.Message.from_dict(reply).text!r}")
    await loop.aclose()


if __name__ == "__main__":
    asyncio.run(main())
