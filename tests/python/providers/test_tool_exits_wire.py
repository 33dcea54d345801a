"""A tool that exits (``sys.exit`` from argparse on bad input) or is interrupted (Ctrl-C) never
leaves its call unanswered on the wire: the next request the vendor's own SDK sends carries a
result for every call (OpenAI and Anthropic refuse a history that does not, and the session
would be stuck)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from provider_helpers import asynctest, done, make, of_type, run, turn_ends
from wire_calls import unanswered

from kerman.providers.testing import FakeServer, Reply, ToolCall

HERE = Path(__file__).parent
WIRED = ("openai-chat", "openai-responses", "anthropic")


async def lookup(args, ctx):
    """Looks a name up, as a command line would parse it."""
    parser = argparse.ArgumentParser(prog="lookup")
    parser.add_argument("name")
    parser.parse_args([])  # the model gave no name: argparse exits with status 2
    return "never"


async def clock(args, ctx):
    """Returns the time."""
    return "12:00"


@pytest.mark.parametrize("protocol", WIRED)
@asynctest
async def test_a_tool_that_exits_is_answered_in_the_next_request(protocol):
    with FakeServer(protocol) as server:
        server.add(
            Reply(tool_calls=[ToolCall("call_1", "lookup", "{}"), ToolCall("call_2", "clock", "{}")]),
            Reply(text="Sorry."),
            Reply(text="Hello again."),
        )
        model = make(protocol, server)
        loop = await run(model, "go", "and again", tools=[lookup, clock])
        assert turn_ends(loop.log) == [{"kind": "completed"}, {"kind": "completed"}]
        assert len(server.requests) == 3
        for request in server.requests[1:]:
            assert unanswered(protocol, request.body) == []
        assert "SystemExit: 2" in json.dumps(server.requests[1].body)
        assert len(of_type(loop.log, "tool/result")) == 2
        await done(loop, model)


@pytest.mark.parametrize("protocol", WIRED)
def test_an_interrupted_tool_is_answered_when_the_session_goes_on(protocol):
    # A child process: KeyboardInterrupt out of an asyncio task leaves CPython 3.11's recursion
    # counter off, which would break the rest of this run.
    child = subprocess.run([sys.executable, str(HERE / "tool_exits_wire_child.py"), protocol], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout.splitlines()[-1])
    assert out["propagated"] == "KeyboardInterrupt"
    assert out["requests"] == 2 and out["unanswered"] == []
    assert [end["kind"] for end in out["ends"]] == ["error", "completed"]
