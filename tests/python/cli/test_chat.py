"""``kerman chat`` end to end: the real command in a pseudo-terminal (pexpect), talking through the
official ``openai`` SDK to a FakeServer on 127.0.0.1, on a FileStore session.

Each test types as a user would and waits for what the screen shows (pexpect's ``expect``, bounded
by ``TIMEOUT``); then it checks what the server received and what the session log holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import kerman
from kerman.providers.testing import FakeServer, HttpError, Reply, ToolCall

pexpect = pytest.importorskip("pexpect")

TIMEOUT = 30  # seconds any one screen condition may take before the test fails
KEY = "sk-chat-test-SECRET-0123"

# A tool that runs until the test creates its "go" file: the window in which the user types.
TOOLS = '''
import asyncio, os
from pathlib import Path

async def wait_for_go(*, ctx) -> str:
    """Waits for the test's signal."""
    go = Path(os.environ["CHAT_TEST_GO"])
    for _ in range(3000):  # 30 s at most
        if go.exists():
            return "job finished"
        await asyncio.sleep(0.01)
    return "gave up waiting"

async def clock() -> str:
    """The time."""
    return "12:00"
'''

FACTORY = """
from kerman.models import EchoModel, ScriptedModel

def echo():
    return EchoModel()

def hostile():
    return ScriptedModel(["red \\x1b[31mALERT\\x1b[0m \\x07 done"] * 3)

def not_a_model():
    return 42

def broken():
    raise RuntimeError("no GPU here")
"""


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer("openai-chat", api_key=KEY) as s:
        yield s


@pytest.fixture
def env(tmp_path: Path) -> Dict[str, str]:
    (tmp_path / "chat_tools.py").write_text(TOOLS)
    (tmp_path / "chat_factory.py").write_text(FACTORY)
    out = dict(os.environ)
    out.update(
        {
            "NO_COLOR": "1",
            "TERM": "dumb",
            "CHAT_TEST_GO": str(tmp_path / "go"),
            "CHAT_KEY": KEY,
            "PYTHONPATH": str(tmp_path),
            "OPENAI_API_KEY": "",
        }
    )
    out.pop("KERMAN_CHAT_DIR", None)
    return out


def kerman_cmd() -> List[str]:
    return [sys.executable, "-m", "kerman"]


def spawn(tmp_path: Path, env: Dict[str, str], *args: str) -> Any:
    argv = kerman_cmd() + ["chat", "--store", str(tmp_path / "store"), *args]
    child = pexpect.spawn(argv[0], argv[1:], env=env, encoding="utf-8", timeout=TIMEOUT, dimensions=(40, 200))
    # The whole screen, for a failing test's report (pytest shows captured output on failure).
    child.logfile_read = sys.stdout
    return child


def openai_args(server: FakeServer, *more: str) -> List[str]:
    return ["--model", "fake-model", "--base-url", server.url, "--api-key-env", "CHAT_KEY", *more]


def finish(child: Any) -> str:
    """``/quit`` and the exit: returns the rest of the screen."""
    child.sendline("/quit")
    child.expect("saved · resume: kerman chat --session (\\S+)")
    session = child.match.group(1)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    return session


def session_events(tmp_path: Path, session: str) -> List[kerman.Event]:
    store = kerman.FileStore(tmp_path / "store")
    log = store.open(session)
    try:
        return list(log.events())
    finally:
        log.close()


def wire_messages(server: FakeServer, index: int) -> List[Dict[str, Any]]:
    return server.requests[index].body["messages"]


def test_streams_runs_tools_and_steers_while_a_tool_runs(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(
        Reply(text=["Let me ", "start it."], tool_calls=[ToolCall("call_1", "wait_for_go", "{}")]),
        Reply(text=["Done, ", "and I checked ", "the logs too."]),
    )
    child = spawn(tmp_path, env, *openai_args(server, "--tool", "chat_tools:wait_for_go"))
    child.expect("> ")
    child.sendline("start the job")
    child.expect("Let me start it.")
    child.expect("⚙ wait_for_go\\(\\{\\}\\)")
    # The tool is running: what the user types now steers the turn.
    child.sendline("also check the logs")
    child.expect("queue \\(1\\): #(\\w{6}) also check the logs")
    (tmp_path / "go").touch()
    child.expect("↳ job finished")
    child.expect("» steer: also check the logs")
    child.expect("Done, and I checked the logs too.")
    child.expect("> ")
    session = finish(child)

    # The second request carries exactly what Chat Completions expects, the steer last.
    assert wire_messages(server, 1) == [
        {"role": "user", "content": "start the job"},
        {
            "role": "assistant",
            "content": "Let me start it.",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "wait_for_go", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "job finished"},
        {"role": "user", "content": "also check the logs"},
    ]
    assert server.requests[0].body["stream"] is True
    events = session_events(tmp_path, session)
    users = [(e.data["content"][0]["text"]) for e in events if e.type == "user/message"]
    assert users == ["start the job", "also check the logs"]
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["completed"]
    texts = [e.data["chunk"]["text"] for e in events if e.type == "assistant/chunk" and e.data["chunk"]["type"] == "text-delta"]
    assert texts == ["Let me ", "start it.", "Done, ", "and I checked ", "the logs too."]


def test_cancel_closes_the_stream_and_keeps_the_partial_text(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(Reply(text=["Once upon", " a time", " there was"], hold_after_text=1), Reply(text="Short version: the end."))
    child = spawn(tmp_path, env, *openai_args(server))
    child.expect("> ")
    child.sendline("tell me a long story")
    child.expect("Once upon")
    child.sendline("/cancel")
    child.expect("\\(interrupted\\)")
    child.expect("\\[turn 1 cancelled\\]")
    assert server.disconnected.wait(TIMEOUT), "the HTTP stream was not closed"
    child.expect("> ")
    child.sendline("the short version please")
    child.expect("Short version: the end.")
    child.expect("> ")
    session = finish(child)

    events = session_events(tmp_path, session)
    replies = [e.data for e in events if e.type == "assistant/message"]
    assert replies[0]["interrupted"] is True
    assert replies[0]["message"]["content"] == [{"type": "text", "text": "Once upon"}]
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["aborted", "completed"]
    # The interrupted text is history for the next request.
    assert wire_messages(server, 1)[:2] == [
        {"role": "user", "content": "tell me a long story"},
        {"role": "assistant", "content": "Once upon"},
    ]


def test_queue_drop_and_resume(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(Reply(text=["Working"], hold_after_text=1), Reply(text="Got your note."))
    child = spawn(tmp_path, env, *openai_args(server))
    child.expect("> ")
    child.sendline("begin")
    child.expect("Working")
    child.sendline("first note")
    child.expect("queue \\(1\\): #(\\w{6}) first note")
    first = child.match.group(1)
    child.sendline("/followup second note")
    child.expect("queue \\(2\\)")
    child.sendline("/queue")
    child.expect("#\\w{6}  next turn  second note")
    child.expect(f"#{first}  next step  first note")
    child.sendline(f"/drop {first}")
    child.expect(f"removed #{first} first note")
    child.sendline(f"/drop {first}")
    child.expect(f"no queued message #{first}")
    child.sendline("/cancel")
    child.expect("\\[turn 1 cancelled\\]")
    child.expect("queue \\(1\\): #\\w{6} second note — /queue, /drop ID kept; Enter \\(or /run\\) runs it")
    session = finish(child)

    # The queue outlives the process: the resumed chat shows it and runs it on Enter.
    child = spawn(tmp_path, env, *openai_args(server, "--session", session))
    child.expect(f"resumed session {session}")
    child.expect("you: begin")
    child.expect("queue \\(1\\): #\\w{6} second note")
    child.expect("press Enter")
    child.sendline("")
    child.expect("Got your note.")
    child.expect("> ")
    assert finish(child) == session

    assert wire_messages(server, 1)[-1] == {"role": "user", "content": "second note"}
    assert all("first note" not in json.dumps(r.body) for r in server.requests)
    events = session_events(tmp_path, session)
    assert [e.data["turn"] for e in events if e.type == "turn/start"] == [1, 2]
    assert not kerman.InboxProjection.fold(e for e in events if e.type == "agent/inbox/spliced").items()


def test_ctrl_c_cancels_a_turn_then_quits_at_idle(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(Reply(text=["Thinking"], hold_after_text=1))
    child = spawn(tmp_path, env, *openai_args(server))
    child.expect("> ")
    child.sendline("go")
    child.expect("Thinking")
    child.sendintr()
    child.expect("\\[turn 1 cancelled\\]")
    child.expect("> ")
    child.sendintr()
    child.expect("saved · resume")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_errors_reach_the_screen_without_the_key(tmp_path: Path, env: Dict[str, str], server: FakeServer) -> None:
    server.add(HttpError(429, "slow down", headers={"retry-after": "0"}), HttpError(401, "bad key"))
    child = spawn(tmp_path, env, *openai_args(server))
    child.expect("> ")
    child.sendline("hello")
    child.expect("\\[retrying: openai-chat: HTTP 429 rate_limit_exceeded: slow down\\]")
    child.expect("\\[turn 1 error: openai-chat: HTTP 401 invalid_api_key: (.*) \\[AUTHENTICATION_FAILED\\]\\]")
    screen = child.before + child.match.group(0)
    child.expect("> ")
    finish(child)
    assert KEY not in screen and "Traceback" not in screen
    # The details (the logged failure) went to the store's chat.log, not the screen.
    assert "turn 1 failed" in (tmp_path / "store" / "chat.log").read_text()
    assert len(server.requests) == 2  # the 429 was retried, the 401 was not


def test_no_retry_fails_the_turn_at_the_first_error_although_providers_retry_by_default(
    tmp_path: Path, env: Dict[str, str], server: FakeServer
) -> None:
    server.add(HttpError(429, "slow down", headers={"retry-after": "0"}), Reply(text="never"))
    child = spawn(tmp_path, env, *openai_args(server), "--no-retry")
    child.expect("> ")
    child.sendline("hello")
    child.expect("\\[turn 1 error: openai-chat: HTTP 429 rate_limit_exceeded: slow down \\[RATE_LIMITED\\]\\]")
    child.expect("> ")
    finish(child)
    assert len(server.requests) == 1


def test_factory_model_and_terminal_escapes(tmp_path: Path, env: Dict[str, str]) -> None:
    child = spawn(tmp_path, env, "--model", "chat_factory:hostile")
    child.expect("> ")
    child.sendline("hi")
    child.expect("red \\\\x1b\\[31mALERT\\\\x1b\\[0m \\\\x07 done")
    child.expect("> ")
    finish(child)
    assert "\x1b[31m" not in child.before


def test_a_second_chat_on_the_same_session_is_refused(tmp_path: Path, env: Dict[str, str]) -> None:
    child = spawn(tmp_path, env, "--model", "chat_factory:echo", "--session", "shared")
    child.expect("> ")
    other = subprocess.run(
        kerman_cmd() + ["chat", "--store", str(tmp_path / "store"), "--model", "chat_factory:echo", "--session", "shared"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert other.returncode == 1
    assert "shared" in other.stderr and "lock" in other.stderr.lower(), other.stderr
    assert "Traceback" not in other.stderr
    finish(child)


def test_piped_input_runs_every_line_then_exits(tmp_path: Path, env: Dict[str, str]) -> None:
    script = tmp_path / "script.txt"
    script.write_text("first\n/queue\nsecond\n")
    with script.open() as stdin:  # a regular file: read by a thread, not the event loop
        done = subprocess.run(
            kerman_cmd() + ["chat", "--store", str(tmp_path / "store"), "--model", "chat_factory:echo", "--session", "piped"],
            env=env,
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    assert done.returncode == 0, done.stderr
    assert "session piped saved" in done.stdout
    events = session_events(tmp_path, "piped")
    replies = [e.data["message"]["content"][0]["text"] for e in events if e.type == "assistant/message"]
    # "second" arrived while turn 1 ran (a steer) or after it (a turn of its own): either way once.
    assert "first" in replies[0] and sum(r.count("second") for r in replies) == 1


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--model", "nosuchmodule:factory"], "cannot import 'nosuchmodule'"),
        (["--model", "chat_factory:missing"], "has no 'missing'"),
        (["--model", "chat_factory:not_a_model"], "returned int, not a model"),
        (["--model", "chat_factory:broken"], "raised RuntimeError: no GPU here"),
        (["--model", "m", "--option", "temperature"], "--option must be KEY=VALUE, got 'temperature'"),
        (["--model", "m", "--api-key-env", "CHAT_NO_SUCH_VAR"], "CHAT_NO_SUCH_VAR: that environment variable is not set"),
        (["--model", "m", "--provider", "cohere"], "invalid choice: 'cohere'"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path: Path, env: Dict[str, str], argv: List[str], needle: str) -> None:
    done = subprocess.run(
        kerman_cmd() + ["chat", "--store", str(tmp_path / "store"), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert needle in done.stderr
    assert "Traceback" not in done.stderr


def test_help_lists_the_commands(tmp_path: Path, env: Dict[str, str]) -> None:
    child = spawn(tmp_path, env, "--model", "chat_factory:echo")
    child.expect("> ")
    child.sendline("/help")
    for command in ("/followup TEXT", "/queue", "/drop ID", "/cancel", "/quit"):
        child.expect_exact(command)
    child.sendline("/nonsense")
    child.expect("unknown command '/nonsense'")
    finish(child)


@pytest.mark.parametrize(
    "protocol, provider",
    [("openai-chat", "openai"), ("openai-responses", "openai-responses"), ("anthropic", "anthropic"), ("gemini", "gemini")],
)
def test_every_provider_streams_in_the_chat(tmp_path: Path, env: Dict[str, str], protocol: str, provider: str) -> None:
    with FakeServer(protocol, api_key=KEY) as server:
        server.add(Reply(text=["Hello ", "from ", provider, "."]))
        child = spawn(tmp_path, env, "--provider", provider, "--instructions", "Be brief.", *openai_args(server))
        child.expect("> ")
        child.sendline("hi")
        child.expect(f"Hello from {provider}\\.")
        child.expect("> ")
        finish(child)
        assert "Be brief." in json.dumps(server.requests[0].body)
        assert server.requests[0].stream


def test_a_local_server_needs_no_key(tmp_path: Path, env: Dict[str, str]) -> None:
    """With --base-url and no key in the environment, a placeholder key is sent (a local server
    ignores it); a key in the SDK's variable is used as it is."""
    with FakeServer("openai-chat") as server:
        server.add(Reply(text="first"), Reply(text="second"))
        for key, expected in (("", "Bearer kerman-local"), ("sk-from-env", "Bearer sk-from-env")):
            child = spawn(tmp_path, {**env, "OPENAI_API_KEY": key}, "--model", "qwen3:8b", "--base-url", server.url)
            child.expect("> ")
            child.sendline("hi")
            child.expect("first|second")
            finish(child)
            assert server.requests[-1].headers["authorization"] == expected
            assert server.requests[-1].body["model"] == "qwen3:8b"  # a model name, not MODULE:FACTORY
