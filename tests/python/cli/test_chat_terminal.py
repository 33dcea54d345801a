"""``kerman chat`` facing hostile strings and input that is not a terminal: the real command as a
subprocess (pexpect for a terminal, plain pipes and /dev/null otherwise), a scripted model from a
factory module, a FileStore session.

Every string the chat prints (queued message ids and texts, model text, tool names, tool results,
errors) reaches the screen with control characters and Unicode bidi controls shown escaped.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

import kerman

pexpect = pytest.importorskip("pexpect")

TIMEOUT = 30  # seconds any one screen condition (or process) may take before the test fails

CLEAR = "\x1b[2J\x1bc"  # clears the screen, then resets the terminal
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
HOSTILE = f"{CLEAR}{BIDI}\x07\x9b"
RAW = ["\x1b", *BIDI, "\x07", "\x9b"]  # none of these may reach the screen raw (NO_COLOR: no styles)

FACTORY = (
    '''
import asyncio, os
from pathlib import Path
import kerman
from kerman.models import EchoModel, ScriptedModel

HOSTILE = %r

def hostile():
    call = {"type": "tool-call", "id": "c1", "name": "tool" + HOSTILE, "arguments": "{}"}
    return ScriptedModel([
        kerman.ModelReply([{"type": "text", "text": "look " + HOSTILE + " here"}, call]),
        kerman.ModelError("provider said " + HOSTILE, code="BAD" + HOSTILE),
    ])

def echo():
    return EchoModel()

async def _slow(request):
    # Holds the reply until the test creates its "go" file (bounded: 30 s).
    go = Path(os.environ["CHAT_TEST_GO"])
    for _ in range(3000):
        if go.exists():
            break
        await asyncio.sleep(0.01)
    text = " ".join(m.text for m in request.messages if m.role == "user")
    return kerman.ModelReply("reply to: " + text)

def slow():
    return _slow

def injecting():
    call = {"type": "tool-call", "id": "c1", "name": "note", "arguments": "{}"}
    return ScriptedModel([kerman.ModelReply([call]), "noted it"])

async def note(*, ctx) -> str:
    """Adds context for the next step."""
    ctx.loop.inject("the build is green")
    return "noted"
'''
    % HOSTILE
)


@pytest.fixture
def env(tmp_path: Path) -> Dict[str, str]:
    (tmp_path / "chat_factory.py").write_text(FACTORY)
    out = dict(os.environ)
    out.update({"NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": str(tmp_path), "CHAT_TEST_GO": str(tmp_path / "go")})
    out.pop("KERMAN_CHAT_DIR", None)
    return out


def chat_argv(tmp_path: Path, *args: str) -> List[str]:
    return [sys.executable, "-m", "kerman", "chat", "--store", str(tmp_path / "store"), *args]


def spawn(tmp_path: Path, env: Dict[str, str], *args: str) -> Any:
    argv = chat_argv(tmp_path, *args)
    child = pexpect.spawn(argv[0], argv[1:], env=env, encoding="utf-8", timeout=TIMEOUT, dimensions=(40, 200))
    screen = io.StringIO()

    class Tee:
        def write(self, text: str) -> None:
            screen.write(text)
            sys.stdout.write(text)

        def flush(self) -> None:
            sys.stdout.flush()

    child.logfile_read = Tee()
    child.screen = screen
    return child


def finish(child: Any) -> str:
    child.sendline("/quit")
    child.expect("saved · resume")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    return child.screen.getvalue()


def queue_hostile(tmp_path: Path, session: str) -> None:
    """A session with input queued (by another program) under hostile ids and texts."""
    store = kerman.FileStore(tmp_path / "store")
    log = store.create(session)
    try:
        inbox = kerman.Inbox(log)
        inbox.append(kerman.NEXT_TURN, kerman.UserMessage("queued " + HOSTILE, id="m-" + CLEAR))
        inbox.append(kerman.NEXT_STEP, kerman.UserMessage("step " + HOSTILE, id="n-" + BIDI))
    finally:
        log.close()


def test_hostile_ids_texts_tool_names_and_errors_are_escaped(tmp_path: Path, env: Dict[str, str]) -> None:
    queue_hostile(tmp_path, "hostile")
    child = spawn(tmp_path, env, "--model", "chat_factory:hostile", "--no-retry", "--session", "hostile")
    child.expect("press Enter")
    child.sendline("/queue")
    child.expect_exact("#" + "\\x1b[2J\\x1bc")
    child.sendline("")  # runs the queued input: a reply, an unknown (hostile) tool, an error
    child.expect("turn 1 error")
    child.expect("> ")
    child.sendline("/drop nothing")
    child.expect("no queued message")
    screen = finish(child)
    leaked = sorted({f"U+{ord(c):04X}" for c in screen if c in RAW})
    assert leaked == [], leaked
    # What was there is shown, escaped.
    assert "\\x1b[2J\\x1bc" in screen and "\\u202e" in screen and "\\x07" in screen and "\\x9b" in screen
    assert "look \\x1b[2J" in screen  # the model's text
    assert "tool\\x1b[2J" in screen  # the tool's name
    assert "provider said \\x1b[2J" in screen  # the error


def test_stdin_from_dev_null_exits_at_once(tmp_path: Path, env: Dict[str, str]) -> None:
    done = subprocess.run(
        chat_argv(tmp_path, "--model", "chat_factory:echo", "--session", "null"),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and done.stderr == "", done.stderr
    assert "session null saved" in done.stdout


@pytest.mark.parametrize("quit", ["/quit", None])
def test_piped_input_waits_for_each_reply(tmp_path: Path, env: Dict[str, str], quit: Any) -> None:
    """Each piped line waits for the reply to the one before: ``/quit`` (or the end of input)
    after a prompt lets that turn finish, and the next prompt is a turn of its own."""
    lines = "first\nsecond\n" + (f"{quit}\n" if quit else "")
    read_end, write_end = os.pipe()  # a pipe, as `... | kerman chat` gives
    with os.fdopen(write_end, "w") as pipe:
        pipe.write(lines)  # all of it is in the pipe before the first reply can come
    proc = subprocess.Popen(
        chat_argv(tmp_path, "--model", "chat_factory:slow", "--session", "piped"),
        env=env,
        stdin=read_end,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(read_end)
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()  # the chat is up: the model may answer now
        Path(env["CHAT_TEST_GO"]).touch()
        out, err = proc.communicate(timeout=TIMEOUT)
        out = banner + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    store = kerman.FileStore(tmp_path / "store")
    log = store.open("piped")
    try:
        events = list(log.events())
    finally:
        log.close()
    ends = [e.data["reason"]["kind"] for e in events if e.type == "turn/end"]
    replies = [e.data["message"]["content"][0]["text"] for e in events if e.type == "assistant/message"]
    assert ends == ["completed", "completed"], ends
    assert replies == ["reply to: first", "reply to: first second"], replies
    assert "reply to: first second" in out


def test_resumed_session_with_queued_input_shows_it_and_a_prompt(tmp_path: Path, env: Dict[str, str]) -> None:
    store = kerman.FileStore(tmp_path / "store")
    log = store.create("resume")
    try:
        inbox = kerman.Inbox(log)
        for i in range(5):
            inbox.append(kerman.NEXT_TURN, kerman.UserMessage(f"queued prompt number {i} with a long tail of words"))
    finally:
        log.close()
    child = spawn(tmp_path, env, "--model", "chat_factory:echo", "--session", "resume")
    child.expect("press Enter")
    for i in range(5):  # every queued entry, in full
        child.expect_exact(f"queued prompt number {i} with a long tail of words")
    child.expect_exact("> ")
    child.sendline("")
    child.expect_exact("queued prompt number 0 with a long tail of words")
    finish(child)


def test_injected_context_is_labelled_context(tmp_path: Path, env: Dict[str, str]) -> None:
    child = spawn(tmp_path, env, "--model", "chat_factory:injecting", "--tool", "chat_factory:note")
    child.expect_exact("> ")
    child.sendline("go")
    child.expect_exact("» context: the build is green")
    child.expect_exact("noted it")
    screen = finish(child)
    assert "steer" not in screen
