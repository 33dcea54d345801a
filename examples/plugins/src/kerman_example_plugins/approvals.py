"""Approvals: a ``before_tool`` gate for tools that spend money or delete things.

* ``payments_gate`` asks a person before a ``transfer`` above ``LIMIT`` (with a note saying
  why), denies any ``delete_*`` call outright, clamps a ``refund`` to ``LIMIT`` (an edit: the
  call runs with the clamped amount), and lets everything else go on down the waterfall.
"""

from __future__ import annotations

import kerman
from kerman.decisions import Verdict

LIMIT = 500


async def payments_gate(call: kerman.ToolCall, next: kerman.Next[Verdict]) -> Verdict:
    arguments = call.arguments if isinstance(call.arguments, dict) else {}
    if call.name.startswith("delete_"):
        return kerman.Deny("deleting needs a ticket, not a chat")
    amount = arguments.get("amount")
    if call.name == "transfer" and isinstance(amount, (int, float)) and amount > LIMIT:
        return kerman.Ask(note=f"a transfer above {LIMIT} needs a person")
    if call.name == "refund" and isinstance(amount, (int, float)) and amount > LIMIT:
        return kerman.Edit({**arguments, "amount": LIMIT})
    verdict: Verdict = await next()
    return verdict


def install(loop: kerman.AgentLoop) -> None:
    """Registers the gate ahead of the gates already registered."""
    loop.before_tool(payments_gate, prepend=True)
