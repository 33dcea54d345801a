"""A tool body that raises what is not an ordinary exception (``SystemExit`` from argparse or
click on bad input, ``KeyboardInterrupt``) still gives its call exactly one ``tool/result``, so
the next request never carries an unanswered call (which the vendors refuse).

``SystemExit`` is the tool's own failure: an error result, reported as a tool bug, the turn goes
on. ``KeyboardInterrupt`` (and any other ``BaseException`` that is not an ``Exception``) answers
every call of the step, ends the turn and then propagates, as it does out of a model, so Ctrl-C
still stops the program. ``CancelledError`` keeps its meaning (covered by the cancel tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest
from loop_helpers import of_type, tool_calls, turn_ends

import kerman
from kerman import AgentLoop, ModelReply

HERE = Path(__file__).parent


def scripted(*replies: Any) -> Any:
    """A model replying ``replies`` in order and recording each request's messages."""
    queue = list(replies)
    seen: List[Any] = []

    async def model(request: kerman.ModelRequest) -> ModelReply:
        seen.append(list(request.messages))
        return queue.pop(0)

    model.seen = seen  # type: ignore[attr-defined]
    return model


def unanswered(messages: List[Any]) -> List[str]:
    """The ids of the tool calls in ``messages`` with no tool result after them."""
    asked = [b["id"] for m in messages if m.role == "assistant" for b in m.content if b["type"] == "tool-call"]
    answered = {b["toolCallId"] for m in messages if m.role == "user" for b in m.content if b["type"] == "tool-result"}
    return [call for call in asked if call not in answered]


def results(log) -> List[Any]:
    return [(e.data["message"]["content"][0]["toolCallId"], e.data.get("error")) for e in of_type(log, "tool/result")]


def run(loop: AgentLoop, prompt: str = "go") -> None:
    async def main() -> None:
        loop.followup(prompt)
        await loop.when_idle()

    asyncio.run(main())


async def exits(args, ctx):
    """Parses its arguments as a command line would."""
    parser = argparse.ArgumentParser(prog="exits")
    parser.add_argument("--count", type=int, required=True)
    parser.parse_args([])  # bad input: argparse prints its usage and calls sys.exit(2)
    return "never"


async def clock(args, ctx):
    return "12:00"


@pytest.mark.parametrize("calls", [1, 3], ids=["lone", "several"])
def test_system_exit_from_a_tool_is_its_error_result_and_the_turn_goes_on(calls, caplog):
    requested = [(f"c{i}", "exits" if i == 0 else "clock") for i in range(calls)]
    model = scripted(tool_calls(*requested), ModelReply("sorry"))
    loop = AgentLoop(model, tools=[kerman.Tool("exits", exits), kerman.Tool("clock", clock)])
    seen: List[Any] = []
    loop.on("agent/error", seen.append)
    run(loop)
    assert turn_ends(loop.log) == [{"kind": "completed"}]
    found = results(loop.log)
    assert [call for call, _ in found] == [call for call, _ in requested]
    assert found[0][1] == {"name": "SystemExit", "code": "TOOL_ERROR", "function": "exits", "traceback": found[0][1]["traceback"]}
    assert "SystemExit: 2" in found[0][1]["traceback"]
    assert [error for _, error in found[1:]] == [None] * (calls - 1)
    # The next request answers every call; the model sees what happened.
    assert len(model.seen) == 2 and unanswered(model.seen[1]) == []
    text = model.seen[1][2].content[0]["content"][0]["text"]
    assert text == "SystemExit: 2"
    # Reported as a tool bug: logger, agent/error, last_error.
    assert len(seen) == 1 and isinstance(seen[0].exception, SystemExit) and seen[0].error["tool"] == "exits"
    assert loop.last_error is seen[0]
    records = [r for r in caplog.records if r.name == "kerman" and r.levelno >= logging.ERROR]
    assert len(records) == 1 and "SystemExit" in records[0].getMessage()


def test_sys_exit_in_a_plain_tool_function_with_a_message():
    def quits(args, ctx):
        sys.exit("usage: quits NAME")

    model = scripted(tool_calls(("c1", "quits")), ModelReply("ok"))
    loop = AgentLoop(model, tools=[kerman.Tool("quits", quits)])
    run(loop)
    assert turn_ends(loop.log) == [{"kind": "completed"}]
    assert model.seen[1][2].content[0]["content"][0]["text"] == "SystemExit: usage: quits NAME"


try:
    import pydantic
except ImportError:  # pragma: no cover - pydantic is a test dependency
    pydantic = None

if pydantic is not None:

    class Person(pydantic.BaseModel):
        name: str

        @pydantic.field_validator("name")
        @classmethod
        def check(cls, value: str) -> str:
            sys.exit(3)


@pytest.mark.skipif(pydantic is None, reason="pydantic is not installed")
def test_a_typed_tools_validator_raising_system_exit_is_an_error_result():
    async def greet(args: Person) -> str:
        return f"hello {args.name}"

    model = scripted(tool_calls(("c1", "greet", '{"args": {"name": "x"}}'), ("c2", "greet", '{"args": {"name": "y"}}')), ModelReply("ok"))
    loop = AgentLoop(model)
    loop.tool(greet)
    run(loop)
    assert turn_ends(loop.log) == [{"kind": "completed"}]
    assert [(call, error and error["name"]) for call, error in results(loop.log)] == [("c1", "SystemExit"), ("c2", "SystemExit")]
    assert unanswered(model.seen[1]) == []


@pytest.mark.parametrize("calls", [1, 3], ids=["lone", "several"])
def test_keyboard_interrupt_answers_every_call_ends_the_turn_and_propagates(calls):
    # In a child process: a KeyboardInterrupt out of an asyncio task leaves CPython 3.11's
    # recursion counter off (any later compile() fails), which would break the rest of the run.
    child = subprocess.run([sys.executable, str(HERE / "tool_exits_child.py"), str(calls)], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout.splitlines()[-1])
    assert out["propagated"] == "KeyboardInterrupt" and out["status"] == "idle"
    found = dict(out["results"])
    assert sorted(found) == sorted(out["requested"])
    assert found["c1"]["name"] == "KeyboardInterrupt" and found["c1"]["code"] == "TOOL_ERROR"
    if calls > 1:
        assert found["c0"]["code"] == "ABORTED_DURING_DISPATCH" and found["c2"]["code"] == "ABORTED_BEFORE_DISPATCH"
        assert out["started"] == ["c0"]
    end = out["ends"][0]
    assert end["kind"] == "error" and end["error"]["code"] == "UNKNOWN" and end["error"]["message"] == "KeyboardInterrupt"
    assert end["error"]["exceptionType"] == "KeyboardInterrupt"
    # The program went on (the interrupt caught around asyncio.run): a loop resumed over the
    # session sent a history where every call has its result, and its turn completed.
    assert out["unanswered"] == [] and out["ends"][1] == {"kind": "completed"}
