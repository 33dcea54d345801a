"""Records the session logs the projection goldens are made from (tests/python/ui/logs/).

Each scenario runs a real AgentLoop with a scripted model over a FileStore and keeps the
session file as it is. Run it only to add or change a scenario; then regenerate the goldens
(``KERMAN_UPDATE_GOLDEN=1 pytest tests/python/ui``) and read the diff:

    python tests/python/ui/record_logs.py            # every scenario
    python tests/python/ui/record_logs.py custom     # only the ones named
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

import kerman
from kerman.models import ScriptedModel

HERE = Path(__file__).parent / "logs"


def text_chunks(*parts: str) -> list[dict]:
    return [{"type": "text-delta", "text": p} for p in parts] + [{"type": "finish", "reason": "stop"}]


async def text(store: kerman.FileStore) -> None:
    """Two prompts queued at once: streamed text, a queue of one, an empty delta, usage."""
    loop = kerman.AgentLoop(
        ScriptedModel(
            [
                [
                    {"type": "text-delta", "text": "Hel"},
                    {"type": "text-delta", "text": ""},
                    {"type": "text-delta", "text": "lo, "},
                    {"type": "text-delta", "text": "wörld"},
                    {"type": "usage", "input": 5, "output": 3},
                    {"type": "finish", "reason": "stop"},
                ],
                text_chunks("Second ", "answer"),
            ]
        ),
        log=store.create("text"),
    )
    loop.followup("hi")
    loop.followup("and again")
    await loop.when_idle()
    await loop.aclose()


async def tools(store: kerman.FileStore) -> None:
    """A streamed tool call, two parallel calls (one unknown, one raising), whole replies."""
    loop = kerman.AgentLoop(
        ScriptedModel(
            [
                [
                    {"type": "text-delta", "text": "Let me look."},
                    {"type": "tool-call", "id": "c1", "name": "lookup", "arguments": '{"q": "kerman"}'},
                    {"type": "finish", "reason": "stop"},
                ],
                kerman.ModelReply(
                    [
                        {"type": "reasoning", "text": "two more"},
                        {"type": "tool-call", "id": "c2", "name": "broken", "arguments": "{}"},
                        {"type": "tool-call", "id": "c3", "name": "missing", "arguments": "{}"},
                    ]
                ),
                kerman.ModelReply("All done."),
            ]
        ),
        log=store.create("tools"),
    )

    @loop.tool
    async def lookup(q: str) -> str:
        """Looks something up."""
        return f"{q}: a durable agent loop"

    @loop.tool
    async def broken() -> str:
        """Always fails."""
        raise RuntimeError("the disk is on fire")

    loop.followup("what is kerman?")
    await loop.when_idle()
    await loop.aclose()


async def steering(store: kerman.FileStore) -> None:
    """A steer and an injected context while a tool runs; both enter the next step."""
    entered = asyncio.Event()
    go = asyncio.Event()
    loop = kerman.AgentLoop(
        ScriptedModel(
            [
                [{"type": "tool-call", "id": "w1", "name": "wait", "arguments": "{}"}, {"type": "finish", "reason": "stop"}],
                text_chunks("Steered: ", "short plan."),
            ]
        ),
        log=store.create("steering"),
    )

    @loop.tool
    async def wait() -> str:
        """Waits for the go-ahead."""
        entered.set()
        await go.wait()
        return "waited"

    loop.followup("plan the release")
    await entered.wait()
    loop.steer("keep it short")
    loop.inject(kerman.UserMessage("today is Friday", source={"kind": "plugin", "plugin": "clock"}))
    go.set()
    await loop.when_idle()
    await loop.aclose()


async def queue_edits(store: kerman.FileStore) -> None:
    """Prompts queued behind a running turn, one replaced and one removed before they run."""
    go = asyncio.Event()
    thinking = asyncio.Event()

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        if not go.is_set():
            thinking.set()
            await go.wait()
        return kerman.ModelReply("re: " + " + ".join(m.text for m in request.entered))

    loop = kerman.AgentLoop(model, log=store.create("queue_edits"))
    loop.followup("first")
    second = loop.followup("second")
    third = loop.followup("third")
    loop.followup("fourth")
    await thinking.wait()
    loop.inbox.replace(second.id, second.with_content("second, edited"))
    loop.inbox.remove(third.id)
    go.set()
    await loop.when_idle()
    await loop.aclose()


async def rejection(store: kerman.FileStore) -> None:
    """A pre-step listener rejects the first prompt; the second is entered."""
    loop = kerman.AgentLoop(ScriptedModel([text_chunks("ok")]), log=store.create("rejection"))

    @loop.pre_step
    async def guard(step: kerman.PreStep, next):  # noqa: ANN001, ANN202
        if any("forbidden" in m.text for m in step.messages):
            return kerman.Reject("no forbidden topics")
        return await next()

    loop.followup("a forbidden topic")
    await loop.when_idle()
    loop.followup("something fine")
    await loop.when_idle()
    await loop.aclose()


async def cancellation(store: kerman.FileStore) -> None:
    """Cancelled mid-stream keeping the inbox, then the kept prompt runs; cancelled again
    without keeping it."""
    streaming = asyncio.Event()

    async def model(request: kerman.ModelRequest):  # noqa: ANN202
        yield {"type": "text-delta", "text": "Working on "}
        yield {"type": "text-delta", "text": "it"}
        if request.turn != 2:
            streaming.set()
            await asyncio.Event().wait()
        yield {"type": "finish", "reason": "stop"}

    loop = kerman.AgentLoop(model, log=store.create("cancellation"))
    loop.followup("long job")
    loop.followup("kept")
    await streaming.wait()
    streaming.clear()
    loop.cancel(keep_inbox=True)
    await loop.when_idle()
    loop.wake()
    await loop.when_idle()
    loop.followup("another long job")
    loop.followup("dropped")
    await streaming.wait()
    loop.cancel()
    await loop.when_idle()
    await loop.aclose()


async def errors(store: kerman.FileStore) -> None:
    """A stream cut by an error and retried, then a model failure ending the turn."""
    attempts = []

    async def model(request: kerman.ModelRequest):  # noqa: ANN202
        attempts.append(request.turn)
        if len(attempts) == 1:
            yield {"type": "text-delta", "text": "Par"}
            yield {"type": "finish", "reason": "error", "error": {"message": "connection reset", "code": "NETWORK"}}
            return
        if request.turn == 1:
            yield {"type": "text-delta", "text": "Partial, then whole."}
            yield {"type": "finish", "reason": "stop"}
            return
        raise kerman.ModelError("rate limited", code="RATE_LIMITED", status=429)
        yield  # an async generator

    loop = kerman.AgentLoop(model, log=store.create("errors"))

    @loop.request_error
    async def retry_once(failure: kerman.RequestFailure, next):  # noqa: ANN001, ANN202
        return kerman.Retry() if failure.failure.get("code") == "NETWORK" else await next()

    loop.followup("try")
    await loop.when_idle()
    loop.followup("try again")
    await loop.when_idle()
    await loop.aclose()


async def decisions(store: kerman.FileStore) -> None:
    """A step asks twice (one approval with a note and an expiry, one edited) while a third call
    needs none; then a step whose approval is denied; the turn goes on to the end."""
    loop = kerman.AgentLoop(
        ScriptedModel(
            [
                kerman.ModelReply(
                    [
                        {"type": "tool-call", "id": "d1", "name": "transfer", "arguments": '{"amount": 900}'},
                        {"type": "tool-call", "id": "d2", "name": "transfer", "arguments": '{"amount": 50}'},
                        {"type": "tool-call", "id": "d3", "name": "lookup", "arguments": '{"q": "rates"}'},
                    ]
                ),
                kerman.ModelReply([{"type": "tool-call", "id": "d4", "name": "transfer", "arguments": '{"amount": 7000}'}]),
                kerman.ModelReply("Two moved, one refused."),
            ]
        ),
        log=store.create("decisions"),
    )

    @loop.tool(needs_approval=True)
    async def transfer(amount: int) -> str:
        """Moves money."""
        return f"moved {amount}"

    @loop.tool
    async def lookup(q: str) -> str:
        """Looks something up."""
        return f"{q}: 3.1%"

    @loop.before_tool
    async def gate(call, next):  # noqa: ANN001, ANN202
        if call.name == "transfer" and call.arguments["amount"] > 500:
            return kerman.Ask(note=f"move {call.arguments['amount']}?", expires_at=4102444800)
        return await next()

    loop.followup("move the money")
    await loop.when_idle()
    first, second = loop.decisions
    loop.decide(first.decision_id, kerman.Approve(), by="ann", key="click-1")
    loop.decide(second.decision_id, kerman.Edit({"amount": 40}), by="ann", key="click-2")
    await loop.when_idle()
    [third] = loop.decisions
    loop.decide(third.decision_id, kerman.Deny("too much"), by="bob")
    await loop.when_idle()
    await loop.aclose()


async def custom(store: kerman.FileStore) -> None:
    """A plugin's own event types: one appended while text streams, one by a tool, one by the
    application between turns (data not an object)."""

    async def model(request: kerman.ModelRequest):  # noqa: ANN202
        if request.step == 1:
            yield {"type": "text-delta", "text": "Checking "}
            request.loop.log.append("progress/update", {"stage": "search", "percent": 40})
            yield {"type": "text-delta", "text": "the index."}
            yield {"type": "tool-call", "id": "c1", "name": "index", "arguments": "{}"}
        else:
            yield {"type": "text-delta", "text": "Indexed."}
        yield {"type": "finish", "reason": "stop"}

    loop = kerman.AgentLoop(model, log=store.create("custom"))

    @loop.tool
    async def index() -> str:
        """Rebuilds the index."""
        loop.log.append("progress/update", {"stage": "index", "percent": 100})
        return "indexed 3 files"

    loop.followup("rebuild the index")
    await loop.when_idle()
    loop.log.append("goal/change", "ship it")
    await loop.aclose()


async def closers(store: kerman.FileStore, root: Path) -> None:
    """The process stops during a tool call; opening the session appends the closers."""
    inside = asyncio.Event()
    loop = kerman.AgentLoop(
        ScriptedModel(
            [
                [
                    {"type": "text-delta", "text": "Running it."},
                    {"type": "tool-call", "id": "t1", "name": "slow", "arguments": "{}"},
                    {"type": "finish", "reason": "stop"},
                ],
            ]
        ),
        log=store.create("closers"),
    )

    @loop.tool
    async def slow() -> str:
        """Never returns before the crash."""
        inside.set()
        await asyncio.Event().wait()
        return "unreachable"

    loop.followup("run the slow tool")
    loop.followup("queued behind it")
    await inside.wait()
    await loop.log.flush()
    crashed = root / "crashed"
    crashed.mkdir()
    shutil.copy(root / "closers.jsonl", crashed / "closers.jsonl")  # the file as a crash leaves it
    await loop.aclose(discard_pending=False)
    reopened = kerman.FileStore(crashed, durability="none")
    reopened.open("closers").close()  # appends the crash closers
    shutil.copy(crashed / "closers.jsonl", HERE / "closers.jsonl")


async def structured_output(store: kerman.FileStore) -> None:
    """A run with an output type: an invalid reply sent back with its error, then a valid one,
    logged as output/validated."""
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    loop = kerman.AgentLoop(
        ScriptedModel([text_chunks('{"answer": "six"}'), text_chunks('{"answer": 6}')]), log=store.create("structured_output")
    )
    await loop.run("2 x 3?", output_type=schema)
    await loop.aclose()


async def compaction(store: kerman.FileStore) -> None:
    """Three turns, then an LLM summary of the first two (the second's question pinned), and a
    turn after it."""
    from kerman.compaction import Summarize

    loop = kerman.AgentLoop(
        ScriptedModel([text_chunks("a0"), text_chunks("a1"), text_chunks("a2"), text_chunks("a3")]), log=store.create("compaction")
    )
    for text in ["q0", "q1", "q2"]:
        loop.followup(text)
        await loop.when_idle()

    @loop.before_compaction
    async def pin(compaction, next):
        compaction.pin(next_of(compaction, "q1"))
        return await next()

    await loop.compact(Summarize(ScriptedModel([kerman.ModelReply("they said q0 and q1", usage={"input": 40, "output": 6})]), keep=2))
    loop.followup("q3")
    await loop.when_idle()
    await loop.aclose()


async def double_texting(store: kerman.FileStore) -> None:
    """A followup sent with on_busy="interrupt" mid-stream (the cut reply stays), then one sent
    with on_busy="rollback" mid-stream (the turn is rolled back)."""
    streaming = asyncio.Event()

    async def model(request: kerman.ModelRequest):  # noqa: ANN202
        yield {"type": "text-delta", "text": "Working on "}
        if request.messages[-1].text.startswith("long"):
            streaming.set()
            await asyncio.Event().wait()
        yield {"type": "text-delta", "text": "it"}
        yield {"type": "finish", "reason": "stop"}

    loop = kerman.AgentLoop(model, log=store.create("double_texting"))
    loop.followup("long job")
    await streaming.wait()
    streaming.clear()
    loop.followup("short one", on_busy="interrupt")
    await loop.when_idle()
    loop.followup("long job again")
    await streaming.wait()
    loop.followup("never mind", on_busy="rollback")
    await loop.when_idle()
    await loop.aclose()


def next_of(compaction, text):
    return next(m for m in compaction.messages if m.text == text)


async def tool_progress(store: kerman.FileStore) -> None:
    """An MCP tool (the test server of tests/python/mcp) reporting progress twice while it runs,
    after the model said a word: tool/progress between the call and its result."""
    from kerman.mcp import MCPServer

    server = MCPServer.stdio(sys.executable, [str(Path(__file__).parents[1] / "mcp" / "mcp_server.py")], name="m")
    loop = kerman.AgentLoop(
        ScriptedModel(
            [
                [
                    {"type": "text-delta", "text": "Working."},
                    {"type": "tool-call", "id": "c1", "name": "progress", "arguments": '{"steps": 2}'},
                    {"type": "finish", "reason": "stop"},
                ],
                text_chunks("Done."),
            ]
        ),
        tools=[server],
        log=store.create("tool_progress"),
    )
    loop.followup("run it")
    await loop.when_idle()
    await loop.aclose()


async def main(only: list[str]) -> None:
    """Records every scenario, or the ones named on the command line (the others' logs, and so
    their goldens, stay as they are)."""
    HERE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = kerman.FileStore(root, durability="none")
        for scenario in (
            text,
            tools,
            steering,
            queue_edits,
            rejection,
            cancellation,
            errors,
            decisions,
            custom,
            structured_output,
            compaction,
            double_texting,
            tool_progress,
        ):
            if only and scenario.__name__ not in only:
                continue
            await scenario(store)
            shutil.copy(root / f"{scenario.__name__}.jsonl", HERE / f"{scenario.__name__}.jsonl")
        if not only or "closers" in only:
            await closers(store, root)
    print(f"recorded {len(list(HERE.glob('*.jsonl')))} logs in {HERE}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
