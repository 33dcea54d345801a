"""``kerman chat`` asks at the prompt when a tool call waits for a decision: the real command in a
pseudo-terminal (pexpect), through the official ``openai`` SDK to a FakeServer, on a FileStore
session whose log is read back for the decisions made."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import kerman
from kerman.providers.testing import FakeServer, Reply, ToolCall

pexpect = pytest.importorskip("pexpect")

TIMEOUT = 30
KEY = "sk-chat-decisions-0123"

TOOLS = '''
import kerman

async def transfer(amount: int) -> str:
    """Moves money."""
    return f"moved {amount}"

async def lookup(q: str) -> str:
    """Looks something up."""
    return f"found {q}"

guarded_transfer = kerman.Tool("transfer", transfer, needs_approval=True)
'''


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer("openai-chat", api_key=KEY) as s:
        yield s


@pytest.fixture
def env(tmp_path: Path) -> Dict[str, str]:
    (tmp_path / "bank_tools.py").write_text(TOOLS)
    out = dict(os.environ)
    out.update({"NO_COLOR": "1", "TERM": "dumb", "CHAT_KEY": KEY, "PYTHONPATH": str(tmp_path), "OPENAI_API_KEY": ""})
    out.pop("KERMAN_CHAT_DIR", None)
    return out


def spawn(tmp_path: Path, env: Dict[str, str], server: FakeServer, *args: str) -> Any:
    argv = [
        sys.executable,
        "-m",
        "kerman",
        "chat",
        "--store",
        str(tmp_path / "store"),
        "--model",
        "fake-model",
        "--base-url",
        server.url,
        "--api-key-env",
        "CHAT_KEY",
        *args,
    ]
    child = pexpect.spawn(argv[0], argv[1:], env=env, encoding="utf-8", timeout=TIMEOUT, dimensions=(40, 200))
    child.logfile_read = sys.stdout
    return child


def finish(child: Any) -> str:
    child.sendline("/quit")
    child.expect("saved · resume: kerman chat --session (\\S+)")
    session = child.match.group(1)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    return str(session)


def logged(tmp_path: Path, session: str, *types: str) -> List[kerman.Event]:
    log = kerman.FileStore(tmp_path / "store").open(session)
    try:
        return [e for e in log.events() if e.type in types]
    finally:
        log.close()


def results(tmp_path: Path, session: str) -> List[Any]:
    """``(call id, error code)`` of each logged tool result: a call whose tool did not run has
    the code saying why."""
    return [
        (e.data["message"]["source"]["callId"], (e.data.get("error") or {}).get("code")) for e in logged(tmp_path, session, "tool/result")
    ]


def tool_messages(server: FakeServer, index: int) -> List[Dict[str, Any]]:
    return [m for m in server.requests[index].body["messages"] if m["role"] == "tool"]


def transfer_call(call_id: str = "call_1", amount: int = 900) -> ToolCall:
    return ToolCall(call_id, "transfer", json.dumps({"amount": amount}))


def test_a_tool_that_needs_approval_is_asked_and_approved(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(Reply(tool_calls=[transfer_call()]), Reply(text=["Moved."]))
    child = spawn(tmp_path, env, server, "--tool", "bank_tools:guarded_transfer")
    child.expect("> ")
    child.sendline("move the money")
    child.expect('\\? run transfer\\(\\{"amount": 900\\}\\)\\?')
    child.expect("approve\\? y/n/e> ")
    child.sendline("y")
    child.expect(f"✓ approved by {getpass.getuser()}")
    child.expect("↳ moved 900")
    child.expect("Moved.")
    child.expect("> ")
    session = finish(child)

    [requested] = logged(tmp_path, session, "decision/requested")
    [resolved] = logged(tmp_path, session, "decision/resolved")
    assert requested.data["name"] == "transfer" and requested.data["arguments"] == '{"amount": 900}'
    assert resolved.data["decisionId"] == requested.data["decisionId"]
    assert resolved.data["outcome"] == "approved" and resolved.data["by"] == getpass.getuser()
    assert [e.data["arguments"] for e in logged(tmp_path, session, "tool/call")] == ['{"amount": 900}']
    assert tool_messages(server, 1)[0]["content"] == "moved 900"


def test_approve_flag_asks_for_every_call_and_a_denial_carries_its_reason(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(Reply(tool_calls=[ToolCall("call_1", "lookup", '{"q": "rates"}')]), Reply(text=["Understood."]))
    child = spawn(tmp_path, env, server, "--tool", "bank_tools:lookup", "--approve")
    child.expect("> ")
    child.sendline("look up the rates")
    child.expect('\\? run lookup\\(\\{"q": "rates"\\}\\)\\?')
    child.expect("approve\\? y/n/e> ")
    child.sendline("n not from this machine")
    child.expect("✗ denied by \\S+: not from this machine")
    child.expect("Understood.")
    child.expect("> ")
    session = finish(child)

    [resolved] = logged(tmp_path, session, "decision/resolved")
    assert resolved.data["outcome"] == "denied" and resolved.data["reason"] == "not from this machine"
    assert results(tmp_path, session) == [("call_1", "TOOL_DENIED")]  # a denied call never runs
    assert "not from this machine" in tool_messages(server, 1)[0]["content"]


def test_edit_reasks_on_bad_json_then_runs_the_edited_arguments(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(Reply(tool_calls=[transfer_call()]), Reply(text=["Moved less."]))
    child = spawn(tmp_path, env, server, "--tool", "bank_tools:guarded_transfer")
    child.expect("> ")
    child.sendline("move the money")
    child.expect("approve\\? y/n/e> ")
    child.sendline("e")
    child.expect('the arguments now: \\{"amount": 900\\}')
    child.expect("arguments \\(JSON\\)> ")
    child.sendline('{"amount": 5')
    child.expect("not JSON .*; type the arguments again")
    child.expect("arguments \\(JSON\\)> ")
    child.sendline("[500]")
    child.expect("the arguments must be a JSON object; type the arguments again")
    child.expect("arguments \\(JSON\\)> ")
    child.sendline('{"amount": 500}')
    child.expect('✎ edited by \\S+: \\{"amount":500\\}')
    child.expect("↳ moved 500")
    child.expect("Moved less.")
    child.expect("> ")
    session = finish(child)

    [resolved] = logged(tmp_path, session, "decision/resolved")
    assert resolved.data["outcome"] == "edited" and resolved.data["arguments"] == '{"amount":500}'
    assert [e.data["arguments"] for e in logged(tmp_path, session, "tool/call")] == ['{"amount":500}']


def test_two_requests_of_one_step_are_asked_one_by_one(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(Reply(tool_calls=[transfer_call("call_1", 900), transfer_call("call_2", 20)]), Reply(text=["Half done."]))
    child = spawn(tmp_path, env, server, "--tool", "bank_tools:guarded_transfer")
    child.expect("> ")
    child.sendline("pay both")
    child.expect('\\? run transfer\\(\\{"amount": 900\\}\\)\\? \\(1 of 2 waiting\\)')
    child.expect("approve\\? y/n/e> ")
    child.sendline("n too much")
    child.expect("✗ denied by \\S+: too much")
    child.expect('\\? run transfer\\(\\{"amount": 20\\}\\)\\?')
    child.expect("approve\\? y/n/e> ")
    child.sendline("yes")
    child.expect("✓ approved")
    child.expect("✗ tool call 'transfer' was denied: too much")
    child.expect("↳ moved 20")
    child.expect("Half done.")
    child.expect("> ")
    session = finish(child)

    requested = logged(tmp_path, session, "decision/requested")
    resolved = logged(tmp_path, session, "decision/resolved")
    assert [r.data["callId"] for r in requested] == ["call_1", "call_2"]
    assert [(r.data["callId"], r.data["outcome"]) for r in resolved] == [("call_1", "denied"), ("call_2", "approved")]
    assert results(tmp_path, session) == [("call_1", "TOOL_DENIED"), ("call_2", None)]
    assert [e.data["arguments"] for e in logged(tmp_path, session, "tool/call")][-1] == '{"amount": 20}'
    assert [m["tool_call_id"] for m in tool_messages(server, 1)] == ["call_1", "call_2"]


def test_cancel_while_asked_cancels_the_turn(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(Reply(tool_calls=[transfer_call()]))
    child = spawn(tmp_path, env, server, "--tool", "bank_tools:guarded_transfer")
    child.expect("> ")
    child.sendline("move the money")
    child.expect("approve\\? y/n/e> ")
    child.sendline("/cancel")
    child.expect("\\[turn 1 cancelled\\]")
    child.expect("> ")
    session = finish(child)

    [resolved] = logged(tmp_path, session, "decision/resolved")
    assert resolved.data["outcome"] == "cancelled"
    assert results(tmp_path, session) == [("call_1", "ABORTED_BEFORE_DISPATCH")]
    assert len(server.requests) == 1  # the model was not asked again


def test_a_resumed_session_asks_its_pending_question_and_takes_the_answer(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    """A question (``Ask(schema=...)``) left pending by another process is asked when the chat
    resumes the session; the typed JSON is the answer, a bad one is asked again."""
    store = kerman.FileStore(tmp_path / "store")
    server.add(Reply(tool_calls=[ToolCall("call_1", "pick", '{"options": [1, 2]}')]), Reply(text=["Picked."]))

    async def leave_a_question() -> str:
        from kerman.providers import OpenAIChat

        log = store.create()
        model = OpenAIChat("fake-model", base_url=server.url, api_key=KEY)
        loop = kerman.AgentLoop(model, log=log)

        @loop.tool
        async def pick(options: List[int]) -> str:
            """Picks one."""
            return "never run"

        @loop.before_tool
        async def gate(call: kerman.ToolCall, next: Any) -> Any:
            return kerman.Ask(note="which one?", schema={"type": "integer"})

        loop.followup("pick one")
        await loop.when_idle()
        assert loop.status == "waiting"
        await loop.aclose()
        await model.aclose()
        log.close()
        return log.id

    session = asyncio.run(leave_a_question())
    child = spawn(tmp_path, env, server, "--session", session)
    child.expect('\\? pick\\(\\{"options": \\[1, 2\\]\\}\\) asks for an answer')
    child.expect("note: which one\\?")
    child.expect("answer> ")
    child.sendline("the second")
    child.expect("not JSON .*; type the answer again")
    child.expect("answer> ")
    child.sendline("2")
    child.expect("✓ answered by \\S+: 2")
    child.expect("Picked.")
    child.expect("> ")
    assert finish(child) == session

    [resolved] = logged(tmp_path, session, "decision/resolved")
    assert resolved.data["outcome"] == "answered" and resolved.data["value"] == 2
    assert tool_messages(server, 1)[0]["content"] == "2"


def test_ctrl_c_while_asked_cancels_the_turn(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(Reply(tool_calls=[transfer_call()]))
    child = spawn(tmp_path, env, server, "--tool", "bank_tools:guarded_transfer")
    child.expect("> ")
    child.sendline("move the money")
    child.expect("approve\\? y/n/e> ")
    child.sendintr()
    child.expect("✗ cancelled")
    child.expect("\\[turn 1 cancelled\\]")
    child.expect("> ")
    session = finish(child)
    assert [r.data["outcome"] for r in logged(tmp_path, session, "decision/resolved")] == ["cancelled"]


def test_quit_leaves_the_request_pending_and_a_resumed_chat_asks_it_again(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(Reply(tool_calls=[transfer_call()]), Reply(text=["Moved."]))
    child = spawn(tmp_path, env, server, "--tool", "bank_tools:guarded_transfer")
    child.expect("> ")
    child.sendline("move the money")
    child.expect("approve\\? y/n/e> ")
    child.sendline("/quit")
    child.expect("the turn waits for decisions")
    child.expect("saved · resume: kerman chat --session (\\S+)")
    session = child.match.group(1)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert logged(tmp_path, session, "decision/resolved") == []

    child = spawn(tmp_path, env, server, "--tool", "bank_tools:guarded_transfer", "--session", session)
    child.expect('\\? run transfer\\(\\{"amount": 900\\}\\)\\?')
    assert "⚙" not in child.before  # the banner sums the session up; its events are not shown again
    child.expect("approve\\? y/n/e> ")
    child.sendline("y")
    child.expect("↳ moved 900")
    child.expect("Moved.")
    child.expect("> ")
    finish(child)
    assert [r.data["outcome"] for r in logged(tmp_path, session, "decision/resolved")] == ["approved"]
    assert len(server.requests) == 2  # the model was not asked again for the decided call


def test_piped_input_answers_the_question_with_its_next_line(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(Reply(tool_calls=[transfer_call()]), Reply(text=["Moved less."]))
    script = 'move the money\ne {"amount": 100}\n/quit\n'
    argv = [
        sys.executable,
        "-m",
        "kerman",
        "chat",
        "--store",
        str(tmp_path / "store"),
        "--model",
        "fake-model",
        "--base-url",
        server.url,
        "--api-key-env",
        "CHAT_KEY",
        "--tool",
        "bank_tools:guarded_transfer",
    ]
    done = subprocess.run(argv, input=script, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert "✎ edited by" in done.stdout and "↳ moved 100" in done.stdout and "Moved less." in done.stdout
    session = done.stdout.split("resume: kerman chat --session ")[1].split()[0]
    [resolved] = logged(tmp_path, session, "decision/resolved")
    assert resolved.data["arguments"] == '{"amount":100}'
