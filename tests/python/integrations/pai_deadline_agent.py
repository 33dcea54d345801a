"""The pydantic-ai agent of the decision-path tests: the approval tests' model asks for two
refunds, ``r7`` (order 7) and ``r8`` (order 8), each of which raises ``ApprovalRequired`` until approved,
with the ``metadata`` given per order (``kerman_expires_at`` / ``kerman_expires_in`` set a
request's deadline); then it answers with what the calls returned. Each model call and each
refund that ran appends a line to ``model.log`` / ``refund.log`` in ``trace_dir``.

Also a child process (``python pai_deadline_agent.py DSN SESSION TRACE_DIR MODE [ARG]``, a
``PostgresStore`` with a one-second lease):

- ``hold``: runs the agent (it pauses for approvals), prints ``paused`` and the decision ids by
  call, then keeps the session (and its lease) until it is killed;
- ``decide DECISIONS``: ``store.decide`` of each ``{call_id: "approve" | "deny:REASON"}`` (the
  decision ids are read from the log), again (ten times at most) while the answer is ``timeout``
  (the dead owner's lease has not lapsed yet); prints the answers;
- ``resume``: ``agent.run(**durability.deferred())`` in a new process; prints the output.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Union

from pai_approval_agent import PROMPT, lines, refunds_model
from pydantic_ai import Agent, ApprovalRequired, DeferredToolRequests, RunContext

__all__ = ["PROMPT", "build", "lines"]
LEASE_TTL = 1.0


def build(
    trace_dir: Path, capabilities: List[Any], metadata: Union[Dict[int, Dict[str, Any]], None] = None
) -> Agent[None, Union[str, DeferredToolRequests]]:
    asked = metadata or {}
    agent: Agent[None, Union[str, DeferredToolRequests]] = Agent(
        refunds_model(trace_dir), name="refunds", output_type=[str, DeferredToolRequests], capabilities=capabilities
    )

    @agent.tool
    def refund(ctx: RunContext[None], order: int, amount: int) -> str:
        """Refunds an order (a person approves each, by a deadline where one is set)."""
        if not ctx.tool_call_approved:
            raise ApprovalRequired(metadata=asked.get(order))
        with open(trace_dir / "refund.log", "a", encoding="utf-8") as f:
            f.write(f"{order}:{amount}\n")
        return f"refunded {amount} on order {order}"

    return agent


async def _child(dsn: str, session: str, trace_dir: Path, mode: str, extra: str) -> None:
    import kerman
    import kerman.decisions as kd
    from kerman.integrations.pydantic_ai import KermanDurability

    store = kerman.PostgresStore(dsn, lease_ttl=LEASE_TTL)
    if mode == "decide":
        log = store.follow(session)
        pending = {p.call_id: p.decision_id for p in kd.pending(log)}
        log.close()
        answers = {}
        for call_id, what in json.loads(extra).items():
            outcome = kerman.Approve() if what == "approve" else kerman.Deny(what.split(":", 1)[1])
            answer = store.decide(session, pending[call_id], outcome, by="ops", key=f"k-{call_id}", timeout=2 * LEASE_TTL)
            for _ in range(10):  # again while the killed owner's lease has not lapsed
                if answer.get("reason") != "timeout":
                    break
                answer = store.decide(session, pending[call_id], outcome, by="ops", key=f"k-{call_id}", timeout=2 * LEASE_TTL)
            answers[call_id] = answer
        print(json.dumps(answers), flush=True)
        return
    durability = KermanDurability(store, session_id=session)
    agent = build(trace_dir, [durability])
    if mode == "hold":
        result = await agent.run(PROMPT)
        assert isinstance(result.output, DeferredToolRequests)
        ids = {p.call_id: p.decision_id for p in kd.pending(durability.log)}
        print(json.dumps(["paused", ids]), flush=True)
        threading.Event().wait()  # holds the session until SIGKILL
    result = await agent.run(**(durability.deferred() or {}))
    print(json.dumps(result.output), flush=True)
    durability.close()


if __name__ == "__main__":
    dsn, session, trace, mode = sys.argv[1:5]
    asyncio.run(_child(dsn, session, Path(trace), mode, sys.argv[5] if len(sys.argv) > 5 else ""))
