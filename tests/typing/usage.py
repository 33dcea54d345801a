"""Type-checked (mypy --strict) against the installed stubs; also executed by the test."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Annotated, Any, Literal

import kerman
from kerman import testing
from kerman.models import ScriptedModel


async def main() -> list[str]:
    store = kerman.MemoryStore()
    log: kerman.SessionLog = store.create("typed")
    inbox = kerman.Inbox(log, on_claimed=lambda m, turn: None)
    stored: kerman.UserMessage = inbox.append("next-turn", "hello")
    inbox.append("next-step", kerman.UserMessage("ctx", source={"kind": "plugin", "plugin": "p"}))
    batch: list[kerman.UserMessage] = inbox.claim("next-turn", 1)
    event: kerman.Event = log.append("goal/change", {"goal": stored.text})
    await log.flush()
    seen = [e.type for e in log.events(types=["goal/change"])]
    projection = kerman.InboxProjection.fold(log.splices())
    placements = [placement for placement, _ in projection.items()]
    work = kerman.consumed_work(log.events())
    log.close()
    failed = await failing_turn()
    typed = await typed_tools()
    briefed = await instructed()
    assert briefed == "Be briefer."
    assert await plugins() == ["REDACTED KEY", "blocked"]
    assert tool_call_payload() == ("pay", 5, 2)
    return [m.text for m in batch] + seen + placements + [str(event.seq), str(work.dropped_unrun), failed] + typed


async def failing_turn() -> str:
    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        raise RuntimeError("typed failure")

    async with kerman.AgentLoop(model) as loop:
        loop.followup("go")
        await loop.when_idle()
        error = loop.last_error
        assert error is not None
        return f"{type(error.exception).__name__}: {error.error['message']}"


async def instructed() -> str | None:
    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        return kerman.ModelReply(request.instructions or "none")

    loop = kerman.AgentLoop(model, instructions="Be brief.")
    loop.instructions = None
    loop.instructions = "Be briefer."
    loop.followup("go")
    await loop.when_idle()
    return loop.instructions


async def guard(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
    if any("rm -rf" in m.text for m in step.messages):
        return kerman.Reject("destructive")
    decision = await next()
    if isinstance(decision, kerman.Enter):
        return kerman.Enter([m.with_content(m.text.upper()) for m in decision.messages])
    return decision


def redact(message: kerman.UserMessage, target: kerman.Target) -> kerman.UserMessage | kerman.Refuse:
    if target == "next-step" and "password" in message.text:
        return kerman.Refuse("no passwords in context")
    return message.with_content(message.text.replace("sk-1", "redacted"))


def install(loop: kerman.AgentLoop) -> None:
    listener: kerman.PreStepListener = guard
    transform: kerman.InsertTransform = redact
    loop.pre_step(listener, prepend=True)
    loop.on_insert(transform)


async def plugins() -> list[str]:
    decision: kerman.Decision = await testing.run_pre_step(guard, ["x"], turn=1, step=1)
    assert isinstance(decision, kerman.Enter)
    fake: testing.FakeNext[kerman.Decision] = testing.FakeNext.entering(testing.make_pre_step(["y"]))
    assert (await guard(testing.make_pre_step(["y"]), fake)).kind == "enter" and fake.calls == 1
    stored: kerman.UserMessage = testing.run_insert(redact, "sk-1")
    try:
        testing.run_insert([redact], "password", target="next-step")
    except kerman.InsertRefusedError as e:
        assert e.reason == "no passwords in context"
    loop = testing.scripted_loop(["ok"], plugins=[install])
    first: testing.TurnResult = await testing.run_turn(loop, "sk-1 key")
    first.assert_completed()
    second = await testing.run_turn(loop, "rm -rf /")
    second.assert_blocked("destructive")
    await loop.aclose()
    return [m.text for m in first.entered] + [second.kind] if stored.text == "redacted" else []


@dataclasses.dataclass
class Filters:
    tags: list[str]
    year: int | None = None


async def typed_tools() -> list[str]:
    calls = [
        {"type": "tool-call", "id": "c1", "name": "search", "arguments": '{"query": "q", "filters": {"tags": ["a"]}}'},
        {"type": "tool-call", "id": "c2", "name": "search", "arguments": '{"query": 1}'},
        {"type": "tool-call", "id": "c3", "name": "legacy", "arguments": '{"any": "thing"}'},
    ]
    loop = kerman.AgentLoop(ScriptedModel([kerman.ModelReply(calls), "done"]))

    @loop.tool
    async def search(
        query: Annotated[str, "What to look for."],
        limit: int = 10,
        filters: Filters | None = None,
        mode: Literal["fast", "exact"] = "fast",
        *,
        ctx: kerman.ToolContext,
    ) -> str:
        """Searches the index."""
        return f"{query} {limit} {filters} {mode} {ctx.call_id}"

    def legacy(args: dict[str, Any], ctx: kerman.ToolContext) -> kerman.ToolResult:
        return kerman.ToolResult(str(sorted(args)))

    tool: kerman.Tool = loop.tool(kerman.Tool("legacy", legacy, description=None, parameters=None))
    assert loop.tools["search"].typed and not tool.typed
    spec = loop.tools["search"].spec()
    assert spec["description"] == "Searches the index." and spec["parameters"]["required"] == ["query"]
    async with loop:
        loop.followup("go")
        await loop.when_idle()
    texts = [e.data["message"]["content"][0]["content"][0]["text"] for e in loop.log.events(types="tool/result")]
    assert texts == ["q 10 Filters(tags=['a'], year=None) fast c1", "invalid tool arguments: query: expected a string, got 1", "['any']"], (
        texts
    )
    return texts[:1]


def tool_call_payload() -> tuple[str, int, int]:
    """The before_tool payload: typed fields, the dataclasses functions, pattern matching."""
    call: kerman.ToolCall = testing.make_tool_call("pay", {"amount": 5})
    later = dataclasses.replace(call, turn=2)
    names = [f.name for f in dataclasses.fields(later)]
    assert names[0] == "loop" and later != call
    match later:
        case kerman.ToolCall(name=name, arguments={"amount": int(amount)}, turn=turn):
            return name, amount, turn
    raise AssertionError(later)


async def in_a_notebook(root: str) -> tuple[str, int]:
    """Issue 15 part 2: reprs, the transcript, re-running cells."""
    store = kerman.FileStore(root, durability="none")
    log = store.open("nb", reuse=True) if store.exists("nb") else store.create("nb")
    assert store.open("nb", reuse=True) is log
    loop = kerman.AgentLoop(kerman.models.ScriptedModel(["hi"]), log=log)
    loop.followup("hello")
    await loop.when_idle()
    transcript: kerman.Transcript = log.transcript()
    first: kerman.Message = transcript[0]
    rest: list[kerman.Message] = transcript[1:]
    entries: list[dict[str, Any]] = transcript.entries()
    html: str = transcript._repr_html_() + log._repr_html_() + loop._repr_html_() + first._repr_html_()
    warning: type[RuntimeWarning] = kerman.TurnStillRunningWarning
    assert warning and html and rest and entries and loop.step == 1 and not loop.closed
    await loop.aclose()
    log.close()
    return first.text, len(transcript)


if __name__ == "__main__":
    print(asyncio.run(main()))
