"""The pydantic-ai agent of the approval tests: a ``FunctionModel`` that asks for two refunds
(``refund`` needs approval), then answers with what the tool calls returned. Each model call
and each refund that ran appends a line to ``model.log`` / ``refund.log`` in ``trace_dir``.

Also a child process (``python pai_approval_agent.py KIND WHERE SESSION TRACE_DIR MODE``):

- ``run``: runs the agent once under ``KermanDurability`` (pausing for approvals) and prints
  ``paused`` and the calls asked about;
- ``run-die``: the same, killed right after the decision requests are durable (before the run's
  end);
- ``resume``: resumes an interrupted run (``pending_prompt()``) when there is one, then goes on
  with the decisions (``deferred()``) and prints the output as JSON;
- ``decide DECISIONS``: decides from this process with ``store.decide``: ``DECISIONS`` is a JSON
  object, call id to ``"approve"`` or ``"deny:REASON"``; prints the answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Union

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

PROMPT = "Refund order 7 and order 8."


def _trace(trace_dir: Path, name: str, line: str) -> None:
    with open(trace_dir / name, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def refunds_model(trace_dir: Path) -> FunctionModel:
    """The model: two refund calls (``r7``, ``r8``), then a text of what they returned."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
        _trace(trace_dir, "model.log", str(len(returns)))
        if not returns:
            seven = ToolCallPart("refund", {"order": 7, "amount": 5}, tool_call_id="r7")
            return ModelResponse(parts=[seven, ToolCallPart("refund", {"order": 8, "amount": 900}, tool_call_id="r8")])
        return ModelResponse(parts=[TextPart("; ".join(f"{p.tool_call_id}: {p.content}" for p in returns))])

    return FunctionModel(model)


def build(trace_dir: Path, capabilities: list[Any]) -> Agent[None, Union[str, DeferredToolRequests]]:
    agent: Agent[None, Union[str, DeferredToolRequests]] = Agent(
        refunds_model(trace_dir), name="refunds", output_type=[str, DeferredToolRequests], capabilities=capabilities
    )

    @agent.tool_plain(requires_approval=True)
    def refund(order: int, amount: int) -> str:
        """Refunds an order (a person approves each)."""
        _trace(trace_dir, "refund.log", f"{order}:{amount}")
        return f"refunded {amount} on order {order}"

    return agent


def lines(trace_dir: Path, name: str) -> list[str]:
    path = trace_dir / name
    return path.read_text().splitlines() if path.exists() else []


def _store(kind: str, where: str) -> Any:
    import kerman

    return kerman.FileStore(where) if kind == "file" else kerman.PostgresStore(where, lease_ttl=0)


async def _child(kind: str, where: str, session: str, trace_dir: Path, mode: str, extra: str) -> None:
    import kerman
    from kerman.integrations import pydantic_ai as kp

    store = _store(kind, where)
    if mode == "decide":
        import kerman.decisions as kd

        log = store.follow(session)
        pending = {p.call_id: p.decision_id for p in kd.pending(log)}
        log.close()
        answers = {}
        for call_id, what in json.loads(extra).items():
            outcome = kerman.Approve() if what == "approve" else kerman.Deny(what.split(":", 1)[1])
            answers[call_id] = store.decide(session, pending[call_id], outcome, by="ops")
        print(json.dumps(answers), flush=True)
        return
    if mode == "run-die":
        kp._Journal._requested = lambda self: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore[method-assign]
    durability = kp.KermanDurability(store, session_id=session)
    agent = build(trace_dir, [durability])
    if mode in ("run", "run-die"):
        result = await agent.run(PROMPT)
        assert isinstance(result.output, DeferredToolRequests)
        print(json.dumps(["paused", [c.tool_call_id for c in result.output.approvals]]), flush=True)
    else:
        prompt = durability.pending_prompt()
        if prompt is not None:  # the run a crash interrupted: it pauses again, from the log
            again = await agent.run(prompt)
            assert isinstance(again.output, DeferredToolRequests)
        result = await agent.run(**durability.deferred())
        print(json.dumps(result.output), flush=True)
    durability.close()


if __name__ == "__main__":
    kind, where, session, trace, mode = sys.argv[1:6]
    asyncio.run(_child(kind, where, session, Path(trace), mode, sys.argv[6] if len(sys.argv) > 6 else ""))
