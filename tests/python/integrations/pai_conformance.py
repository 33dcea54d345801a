"""Conformance agents for pydantic-ai's durable engines: small agents in the style of
pydantic-ai's documented examples (tools, structured output, streaming, deferred approvals), each
scripted by a ``FunctionModel`` so a run is deterministic, run under ``KermanDurability`` or
``DBOSDurability`` (SQLite).

Every model call and every tool execution appends one line to a file in the work directory, so
the parent counts what ran across processes. Write tools append to ``<tool>.write.log``.

Child process: ``python pai_conformance.py ENGINE AGENT WORKDIR KILL`` where ``ENGINE`` is
``kerman`` (the default ``sync="units"``: every unit durable before the next, so each is a journal
write), ``kerman-effects`` (``sync="effects"``) or ``dbos``, and ``KILL`` is
``0`` (no kill), ``N`` (SIGKILL right after the engine's ``N``-th journal write of this process:
a Kerman append made durable, a DBOS step output recorded) or ``in:<tool>`` (SIGKILL inside that
tool, right after its effect). A first process starts the run with the agent's prompt; a
restarted one is given no prompt: it finds the interrupted run in the engine's journal (Kerman:
``KermanDurability.pending_prompt()``; DBOS: the workflow by its id) and finishes it. Prints
``{"output": ..., "writes": N}`` where ``writes`` counts the journal writes of this process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.capabilities import HandleDeferredToolCalls, ProcessEventStream
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    PartStartEvent,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_core import to_jsonable_python

WORKFLOW_ID = "conformance-run"


def trace(work: Path, name: str, line: str) -> None:
    with open(work / name, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def write(work: Path, tool: str, result: str) -> str:
    """A write tool's effect: one line in its ledger (the external system), its result."""
    trace(work, f"{tool}.write.log", result)
    return result


def reconcile_from_ledger(work: Path, tool: str) -> Callable[[Any], Any]:
    """A ``reconcile`` for ``KermanDurability``: looks the write up in its ledger (each agent
    here writes once per tool per run): its result if it happened, else ``None`` (run it)."""

    def reconcile(call: Any) -> Any:
        path = work / f"{tool}.write.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return lines[-1] if lines else None

    return reconcile


WRITES = {"bank": ["transfer"], "cities": [], "mailer": ["send_email"], "refunds": ["refund"]}


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]


# -- the agents ------------------------------------------------------------------------------------


def bank(work: Path, capabilities: list[Any]) -> tuple[Agent[Any, Any], str]:
    """Tools: a support agent that looks a balance up (a read) and moves money (a write)."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = _returns(messages)
        trace(work, "model.log", str(len(returns)))
        if not returns:
            return ModelResponse(parts=[ToolCallPart("balance", {"account": "A-17"}, tool_call_id="t1")])
        if len(returns) == 1:
            return ModelResponse(parts=[ToolCallPart("transfer", {"account": "A-17", "amount": 25}, tool_call_id="t2")])
        return ModelResponse(parts=[TextPart(f"Balance was {returns[0].content}; {returns[1].content}.")])

    agent = Agent(FunctionModel(model), name="bank", instructions="You help bank customers.", capabilities=capabilities)

    @agent.tool_plain(metadata={"kerman_effect": "read"})
    def balance(account: str) -> str:
        """The balance of an account."""
        trace(work, "balance.read.log", account)
        return "100.00 EUR"

    @agent.tool_plain
    def transfer(account: str, amount: int) -> str:
        """Moves money out of an account (a write)."""
        return write(work, "transfer", f"moved {amount} EUR out of {account}")

    return agent, "Move 25 EUR out of my account A-17 if I can afford it."


class CityInfo(BaseModel):
    city: str
    country: str
    population_millions: float


def cities(work: Path, capabilities: list[Any]) -> tuple[Agent[Any, Any], str]:
    """Structured output: looks a city up (a read), then answers through the output tool."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = _returns(messages)
        trace(work, "model.log", str(len(returns)))
        if not returns:
            return ModelResponse(parts=[ToolCallPart("census", {"city": "Lyon"}, tool_call_id="c1")])
        output = {"city": "Lyon", "country": "France", "population_millions": float(returns[0].content)}
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, output, tool_call_id="c2")])

    agent = Agent(FunctionModel(model), name="cities", output_type=CityInfo, capabilities=capabilities)

    @agent.tool_plain(metadata={"kerman_effect": "read"})
    def census(city: str) -> str:
        """The population of a city, in millions."""
        trace(work, "census.read.log", city)
        return "0.52"

    return agent, "Where is Lyon, and how many people live there?"


def mailer(work: Path, capabilities: list[Any]) -> tuple[Agent[Any, Any], str]:
    """Streaming: a streamed model (text deltas, a streamed tool call) that sends an email (a
    write); an event stream handler consumes the events."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        returns = _returns(messages)
        trace(work, "model.log", str(len(returns)))
        if not returns:
            yield "Sending "
            yield "it now."
            yield {0: DeltaToolCall(name="send_email", json_args='{"to": "ana@example.com", ', tool_call_id="m1")}
            yield {0: DeltaToolCall(json_args='"subject": "Lunch"}')}
        else:
            yield "Sent: "
            yield str(returns[0].content)

    async def handler(ctx: RunContext[Any], events: Any) -> None:
        async for event in events:
            # Under a durable engine the model unit consumes the stream and the handler gets its
            # events whole (a text part's start carries its text), live or replayed.
            if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                trace(work, "stream.log", event.part.content)

    agent = Agent(FunctionModel(stream_function=stream), name="mailer", capabilities=[*capabilities, ProcessEventStream(handler)])

    @agent.tool_plain
    def send_email(to: str, subject: str) -> str:
        """Sends an email (a write)."""
        return write(work, "send_email", f"email to {to} about {subject!r}")

    return agent, "Email Ana about lunch."


def refunds(work: Path, capabilities: list[Any]) -> tuple[Agent[Any, Any], str]:
    """Deferred approvals: refunds need approval; a handler in the run approves small ones."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = _returns(messages)
        trace(work, "model.log", str(len(returns)))
        if not returns:
            return ModelResponse(
                parts=[
                    ToolCallPart("refund", {"order": "O-1", "amount": 40}, tool_call_id="r1"),
                    ToolCallPart("refund", {"order": "O-2", "amount": 500}, tool_call_id="r2"),
                ]
            )
        return ModelResponse(parts=[TextPart(" | ".join(f"{r.tool_call_id}: {r.content}" for r in returns))])

    def approve(ctx: RunContext[Any], requests: DeferredToolRequests) -> DeferredToolResults:
        approvals = {call.tool_call_id: call.args_as_dict()["amount"] <= 100 for call in requests.approvals}
        return DeferredToolResults(approvals=approvals)

    agent = Agent(FunctionModel(model), name="refunds", capabilities=[*capabilities, HandleDeferredToolCalls(handler=approve)])

    @agent.tool_plain(requires_approval=True)
    def refund(order: str, amount: int) -> str:
        """Refunds an order (a write that needs approval)."""
        return write(work, "refund", f"refunded {amount} on {order}")

    return agent, "Refund my two orders."


AGENTS: dict[str, Callable[[Path, list[Any]], tuple[Agent[Any, Any], str]]] = {
    "bank": bank,
    "cities": cities,
    "mailer": mailer,
    "refunds": refunds,
}


# -- the child -------------------------------------------------------------------------------------


class _Killer:
    """Counts the engine's journal writes; SIGKILLs the process after the ``at``-th."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.writes = 0

    def wrote(self) -> None:
        self.writes += 1
        if self.writes == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


def _kill_in(work: Path, tool: str) -> None:
    global write
    real = write

    def write_then_die(work_: Path, name: str, result: str) -> str:
        real(work_, name, result)
        if name == tool:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    write = write_then_die


async def _kerman(name: str, work: Path, killer: _Killer, sync: str) -> Any:
    import kerman
    from kerman.integrations import pydantic_ai as kp

    kp._Journal._logged = lambda self: killer.wrote()  # type: ignore[method-assign]
    kp._Journal._marked = lambda self: killer.wrote()  # type: ignore[method-assign]
    # Each write tool reconciles a call in doubt from its ledger (docs/frameworks.md).
    effects = {tool: ("write", reconcile_from_ledger(work, tool)) for tool in WRITES[name]}
    durability = kp.KermanDurability(kerman.FileStore(str(work / "sessions")), session_id="s", effects=effects, sync=sync)
    agent, prompt = AGENTS[name](work, [durability])
    pending = durability.pending_prompt()
    if pending is not None:
        prompt = pending  # a restart: the prompt comes from the log
    elif (work / "started").exists():
        raise SystemExit("a restart found no interrupted run in the session")
    (work / "started").touch()
    result = await agent.run(prompt)
    durability.close()
    return result.output


async def _dbos(name: str, work: Path, killer: _Killer) -> Any:
    from dbos import DBOS, SetWorkflowID
    from dbos._sys_db import SystemDatabase
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    real = SystemDatabase.record_operation_result

    def record(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        killer.wrote()
        return out

    SystemDatabase.record_operation_result = record  # type: ignore[method-assign]
    DBOS(config={"name": f"conformance-{name}", "system_database_url": f"sqlite:///{work / 'dbos.sqlite'}", "log_level": "ERROR"})
    agent, prompt = AGENTS[name](work, [DBOSDurability()])

    @DBOS.workflow(name=f"conformance.{name}")
    async def run(prompt: str) -> Any:
        return to_jsonable_python((await agent.run(prompt)).output)

    restart = (work / "started").exists()
    DBOS.launch()
    try:
        if restart:  # a restart: DBOS has the workflow and its input
            handle = await DBOS.retrieve_workflow_async(WORKFLOW_ID)
            return await handle.get_result()
        (work / "started").touch()
        with SetWorkflowID(WORKFLOW_ID):
            return await run(prompt)
    finally:
        DBOS.destroy()


def main(engine: str, name: str, work: Path, kill: str) -> None:
    killer = _Killer(int(kill) if kill.isdigit() else 0)
    if kill.startswith("in:"):
        _kill_in(work, kill[3:])
    if engine == "dbos":
        output = asyncio.run(_dbos(name, work, killer))
    else:
        output = asyncio.run(_kerman(name, work, killer, "units" if engine == "kerman" else "effects"))
    print(json.dumps({"output": to_jsonable_python(output), "writes": killer.writes}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4])
