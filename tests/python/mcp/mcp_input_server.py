"""An MCP server that asks for input the 2026-07-28 way (an input-required result with a state
token), for test_mcp_durable_input.py; written with the ``mcp`` package's server side, served
over stdio.

Its state token is sealed with a fixed key, so a server started again (by a client process
that was killed and started again) accepts the token the first one minted. Each completed
call appends one line to the file ``KERMAN_MCP_MARKER`` names.
"""

from __future__ import annotations

import os
from typing import Annotated

from mcp.server.mcpserver import AcceptedElicitation, Elicit, ElicitationResult, MCPServer, Resolve
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

MARKER = os.environ.get("KERMAN_MCP_MARKER")

server = MCPServer("kerman-input-test", request_state_security=RequestStateSecurity(keys=[b"k" * 32]))


class Confirm(BaseModel):
    ok: bool
    note: str = ""


def _confirm(amount: int) -> Elicit[Confirm]:
    return Elicit(f"Transfer {amount}?", Confirm)


@server.tool()
async def transfer(amount: int, answer: Annotated[ElicitationResult[Confirm], Resolve(_confirm)]) -> str:
    """Transfers ``amount`` once a person confirms."""
    if isinstance(answer, AcceptedElicitation):
        outcome = f"transferred {amount}" if answer.data.ok else f"not transferred: {answer.data.note}"
    else:
        outcome = answer.action
    if MARKER:
        with open(MARKER, "a") as f:
            f.write(outcome + "\n")
    return outcome


class Amount(BaseModel):
    amount: int


def _amount(to: str) -> Elicit[Amount]:
    return Elicit(f"How much to {to}?", Amount)


def _sure(to: str) -> Elicit[Confirm]:
    return Elicit(f"Really pay {to}?", Confirm)


@server.tool()
async def pay(
    to: str,
    amount: Annotated[ElicitationResult[Amount], Resolve(_amount)],
    sure: Annotated[ElicitationResult[Confirm], Resolve(_sure)],
) -> str:
    """Pays ``to`` once a person says how much and confirms (two inputs asked at once)."""
    if isinstance(amount, AcceptedElicitation) and isinstance(sure, AcceptedElicitation) and sure.data.ok:
        return f"paid {amount.data.amount} to {to}"
    return "not paid"


if __name__ == "__main__":
    server.run()
