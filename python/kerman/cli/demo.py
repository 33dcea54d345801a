"""``kerman demo``: a scripted agent session that shows the whole product in a few seconds.

It runs in a fresh folder and needs no network; the "model" is a small deterministic function.
In order: a followup becomes a turn; a user steers while a tool runs; a plugin injects context
without waking the loop; a context plugin rewrites the claimed batch; a guard plugin rejects a
destructive prompt; a streaming reply is cancelled with ``keep_inbox=True``; a second process
is killed while a pre-step plugin holds a claimed batch; the session is reopened (crash closers),
the lost input is brought back with ``requeue_claimed`` and run; finally the timeline and the
inbox are printed from the durable log.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator, Dict, Optional

from .. import (
    AgentLoop,
    Decision,
    Enter,
    FileStore,
    InboxProjection,
    ModelReply,
    ModelRequest,
    Next,
    PreStep,
    Reject,
    SessionLog,
    ToolContext,
    ToolResultMessage,
    UserMessage,
    events,
)
from ._timeline import format_event, message_text

SESSION = "demo"
DESTRUCTIVE = ("rm -rf", "drop table", "git push --force")
# Left out of the printed timeline to keep it short; `kerman log show` prints every event.
HIDDEN = (events.StepStart, events.StepEnd, events.RequestHeader)


def _say(text: str) -> None:
    print(f"\n== {text}")


def _show(label: str, text: str) -> None:
    print(f"   {label:<9} {text}")


def _show_inbox(log: SessionLog) -> None:
    """The queue as a UI sees it: a fold of the durable splice events."""
    items = InboxProjection.fold(log.splices()).items()
    if not items:
        _show("inbox", "(empty)")
    for placement, message in items:
        _show("inbox", f"{placement}: {message.text!r}")


def _last_reply(log: SessionLog) -> str:
    replies = [v for v in log.events(types=events.ASSISTANT_MESSAGE, view=True) if isinstance(v, events.AssistantMessageEvent)]
    return message_text(replies[-1].message) if replies else ""


def _ending(log: SessionLog) -> events.Ending:
    """The ending of the turn the log's last event closed."""
    last = events.view(log[-1])
    if not isinstance(last, events.TurnEnd):
        raise RuntimeError(f"the demo expected a turn/end, the log ends with {last!r}")
    return last.reason


class DemoModel:
    """A stand-in for an LLM: deterministic, no network. It reads the user messages entered in
    this step (``request.entered``) and answers with canned text, a tool call, or a stream
    that stalls (so the demo can cancel it)."""

    def __init__(self) -> None:
        self.streaming = asyncio.Event()  # set once the stalling stream has produced its first chunk

    def __call__(self, request: ModelRequest) -> Any:
        said = " ".join(m.text for m in request.entered).lower()
        if "report" in said:
            return self._stalling_stream()
        return self._reply(said, request)

    async def _reply(self, said: str, request: ModelRequest) -> ModelReply:
        if "which files" in said:
            return ModelReply(
                [{"type": "text", "text": "Let me look."}, {"type": "tool-call", "id": "call-1", "name": "list_files", "arguments": "{}"}]
            )
        if "python" in said:  # a steer that arrived while list_files ran: answer from its result
            listing = next(message_text(m.to_dict()) for m in reversed(request.messages) if isinstance(m, ToolResultMessage))
            return ModelReply("Python files: " + ", ".join(f for f in listing.split() if f.endswith(".py")))
        if "summarise" in said:
            return ModelReply("Two files changed since the last turn: loop.py and README.md.")
        if "email" in said:
            return ModelReply("Done: the report went to the team.")
        return ModelReply("Hi! I read your project, call tools, and take corrections mid-answer.")

    async def _stalling_stream(self) -> AsyncIterator[Dict[str, Any]]:
        yield {"type": "text-delta", "text": "Release report. Part 1: the loop claims input before "}
        yield {"type": "text-delta", "text": "every step, "}
        self.streaming.set()
        await asyncio.Event().wait()  # the rest never comes


def _plugins(loop: AgentLoop) -> None:
    """The two pre-step plugins: a guard, then a context folder (a waterfall, in this order)."""

    @loop.pre_step
    async def guard(step: PreStep, next: Next[Decision]) -> Decision:
        for message in step.messages:
            hit = [word for word in DESTRUCTIVE if word in message.text.lower()]
            if hit:
                return Reject(f"destructive command ({hit[0]}) needs a human")
        return await next()

    @loop.pre_step
    async def fold_context(step: PreStep, next: Next[Decision]) -> Decision:
        notes = [m for m in step.messages if m.source.get("kind") == "plugin"]
        if not notes:
            return await next()
        rest = [m for m in step.messages if m not in notes]
        folded = UserMessage("Context: " + "; ".join(m.text for m in notes), source={"kind": "plugin", "plugin": "context"})
        return Enter(rest + [folded])


def _tools(loop: AgentLoop, tool_running: asyncio.Event, may_finish: asyncio.Event) -> None:
    @loop.tool
    async def list_files(args: Dict[str, Any], ctx: ToolContext) -> str:
        """Lists the files in the project."""
        tool_running.set()
        await may_finish.wait()  # a slow tool: the demo steers meanwhile
        return "README.md Cargo.toml loop.py demo.py"


async def _run(folder: Path) -> None:
    store = FileStore(folder, durability="checkpoint")
    log = store.create(SESSION)
    model = DemoModel()
    loop = AgentLoop(model, log)
    _plugins(loop)
    tool_running, may_finish = asyncio.Event(), asyncio.Event()
    _tools(loop, tool_running, may_finish)

    _say("loop.followup(): a prompt becomes a turn")
    loop.followup("Hi! What can you do?")
    await loop.when_idle()
    _show("agent", _last_reply(log))

    _say("a tool call, and loop.steer() while the tool runs")
    loop.followup("Which files are in the project?")
    await tool_running.wait()
    loop.steer("Only the Python ones, please.")
    _show("user", "steers while list_files runs: 'Only the Python ones, please.'")
    may_finish.set()
    await loop.when_idle()
    _show("agent", _last_reply(log) + "  (the steer entered right after the tool result)")

    _say("loop.inject(): a plugin queues context without waking the loop")
    loop.inject(UserMessage("git: loop.py and README.md changed", source={"kind": "plugin", "plugin": "git"}))
    _show("loop", f"still {loop.status}")
    _show_inbox(log)

    _say("a pre_step plugin rewrites the next batch: the context is folded into a message of its own")
    loop.followup("Summarise what changed")
    await loop.when_idle()
    entered = [v.message for v in log.events(types=events.USER_MESSAGE, view=True) if isinstance(v, events.UserMessageEvent)]
    for message in entered[-2:]:
        _show("entered", repr(message_text(message)) + f"  from {message.source.plugin or message.source.kind}")
    _show("agent", _last_reply(log))

    _say("a guard pre_step plugin rejects a destructive prompt")
    loop.followup("Clean up: rm -rf ~/project")
    await loop.when_idle()
    _show("turn/end", str(_ending(log).raw))

    _say("loop.cancel(keep_inbox=True) mid-stream, with a prompt queued behind the turn")
    loop.followup("Write a long report on the release")
    await model.streaming.wait()
    loop.followup("Then email it to the team")
    loop.cancel(keep_inbox=True)
    await loop.when_idle()
    _show("turn/end", str(_ending(log).raw) + "  (the partial reply is logged, interrupted)")
    _show_inbox(log)

    _say("crash: a second process resumes the session, and is killed mid-turn")
    await loop.aclose()  # pending input stays in the log (D7)
    await log.aclose()
    crashed_turn = loop.turn + 1
    said = _crash_in_another_process(folder)
    _show("process 2", f"turn {crashed_turn}: {said}; a pre_step plugin awaits approval ... SIGKILL")

    _say("resume: store.open() closes the open turn; requeue_claimed() brings back its input")
    log = store.open(SESSION)
    loop = AgentLoop(model, log)
    _plugins(loop)
    _show("turn/end", f"turn {crashed_turn} {_ending(log).kind}  (appended by store.open)")
    if len(loop.inbox):
        _show_inbox(log)
    else:
        _show("inbox", "(empty: the prompt was claimed by the crashed turn)")
    requeued = loop.requeue_claimed(crashed_turn)
    _show("requeued", ", ".join(repr(m.text) for m in requeued))
    loop.wake()
    await loop.when_idle()
    _show("agent", _last_reply(log))
    loop.inject(UserMessage("CI: the release pipeline is green", source={"kind": "plugin", "plugin": "ci"}))
    await loop.aclose()  # keeps the injected context durable for the next session (D7)

    shown = [v for v in log.events(view=True) if not isinstance(v, HIDDEN)]
    _say(f"Timeline: {len(shown)} of {len(log)} events (every event: kerman log show {folder} {SESSION})")
    t0 = log[0].time
    for event in shown:
        print(format_event(event, t0=t0))
    _say("Final inbox (aclose() kept it durable)")
    _show_inbox(log)
    await log.aclose()


_CHILD = """
import asyncio, sys
if sys.argv[2] not in sys.path:  # import the same kerman as the parent
    sys.path.insert(0, sys.argv[2])
from kerman.cli.demo import _crashing_process
asyncio.run(_crashing_process(sys.argv[1]))
"""


async def _crashing_process(folder: str) -> None:
    """Runs in a second process: resumes the session, wakes the loop, and stalls inside a
    pre-step plugin after the batch is claimed, until the parent kills the process."""
    log = FileStore(folder, durability="checkpoint").open(SESSION)
    loop = AgentLoop(DemoModel(), log)

    @loop.pre_step
    async def approval(step: PreStep, next: object) -> Any:
        await log.flush()  # the claim is on disk
        print("claimed " + ", ".join(repr(m.text) for m in step.messages), flush=True)
        await asyncio.Event().wait()  # waiting for a human approval that never comes

    loop.wake()
    await loop.when_idle()


def _crash_in_another_process(folder: Path) -> str:
    """Starts :func:`_crashing_process`, waits until it has claimed, kills it; returns what it said."""
    package_root = str(Path(__file__).resolve().parent.parent)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(folder), package_root], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if not line.startswith("claimed"):
            child.kill()
            _, err = child.communicate()
            raise RuntimeError(f"the second process failed before its claim:\n{err}")
        return line
    finally:
        child.kill()  # SIGKILL: no closers, no flush, no cleanup
        child.communicate()


class _Narrator(logging.Handler):
    """Prints the ``kerman`` logger's warnings (e.g. crash closers on open) in the demo's output."""

    def emit(self, record: logging.LogRecord) -> None:
        _show("log", record.getMessage())


def main(args: Optional[argparse.Namespace] = None) -> int:
    """Runs the demo in ``args.dir`` (a fresh temporary folder by default)."""
    folder_arg: Any = getattr(args, "dir", None)
    if folder_arg:
        folder = Path(folder_arg)
        folder.mkdir(parents=True, exist_ok=True)
        if any(folder.iterdir()):
            print(f"kerman demo: {folder} is not empty; pass a fresh folder", file=sys.stderr)
            return 2
    else:
        folder = Path(tempfile.mkdtemp(prefix="kerman-demo-"))
    print(f"Kerman demo in {folder}{os.sep}")
    narrator = _Narrator(logging.WARNING)
    logger = logging.getLogger("kerman")
    logger.addHandler(narrator)
    try:
        asyncio.run(_run(folder))
    finally:
        logger.removeHandler(narrator)
    print(f"\nThe session stays in {folder}; try: kerman log show {folder} {SESSION}")
    return 0
