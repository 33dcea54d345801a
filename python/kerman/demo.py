"""``kerman demo``: a scripted session that shows the durable inbox at work.

It runs in a fresh folder, needs no network and finishes in well under a second: queue prompts
and context, edit and remove queued items, watch a UI-style mirror follow the log, claim a
batch the way the loop does before a step, crash mid-write, reopen (the torn tail is repaired
and the inbox replayed from the log), and print the timeline.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

from . import FileStore, Inbox, InboxProjection, UserMessage
from ._timeline import format_event

SESSION = "demo"


def _say(text: str) -> None:
    print(f"\n== {text}")


def _show_inbox(inbox: Inbox) -> None:
    projection = InboxProjection.fold(inbox.log.splices())
    items = projection.items()
    if not items:
        print("   (inbox empty)")
    for placement, message in items:
        print(f"   {placement:<8} {message.text!r}  [{message.source['kind']}]")


async def _run(folder: Path) -> None:
    store = FileStore(folder, durability="strict")
    log = store.create(SESSION)
    live: list[str] = []
    inbox = Inbox(
        log,
        on_inserted=lambda m: live.append(f"inserted  {m.text!r}"),
        on_discarded=lambda m: live.append(f"discarded {m.text!r}"),
        on_claimed=lambda m, turn: live.append(f"claimed   {m.text!r} (turn {turn})"),
    )
    # A UI keeps its own projection, fed only by the durable splice stream.
    mirror = InboxProjection()
    log.subscribe(mirror.apply)

    _say("A user queues two prompts; a plugin injects context; the user steers")
    inbox.append("next-turn", "Summarise the design note")
    draft = inbox.append("next-turn", "Then list the open issues")
    inbox.append("next-step", UserMessage("Workspace: 3 files changed", source={"kind": "plugin", "plugin": "workspace"}))
    inbox.append("next-step", "Keep it under 100 words")
    _show_inbox(inbox)

    _say("The user edits the second prompt (same id) and drops a stale one")
    inbox.replace(draft.id, draft.with_content("Then list the open issues, newest first"))
    stale = inbox.append("next-turn", "(stale) Re-run the benchmarks")
    inbox.remove(stale.id)
    _show_inbox(inbox)

    _say("Before a step the loop claims the whole batch at once: all next-step input, then one prompt")
    batch = inbox.claim("next-turn", 1)
    for message in batch:
        print(f"   entered  {message.text!r}")
    log.append("goal/change", {"goal": "answer the user"})
    await log.flush()  # strict durability: everything so far is on disk
    print(f"   the UI mirror agrees with the inbox: {mirror.next_turn == inbox.next_turn and mirror.next_step == inbox.next_step}")

    _say("Live notifications, in order")
    for line in live:
        print(f"   {line}")

    _say("Crash: the process dies halfway through writing one more event")
    inbox.append("next-turn", "Written just before the crash")
    log.close()
    path = next(p for p in folder.iterdir() if p.suffix == ".jsonl")
    data = path.read_bytes()
    last_line_start = data.rstrip(b"\n").rfind(b"\n") + 1
    cut = last_line_start + (len(data) - last_line_start) // 2
    with open(path, "r+b") as f:
        f.truncate(cut)
    print(f"   cut {len(data) - cut} bytes off {path.name}")

    _say("Reopen: the torn tail is truncated and the inbox is replayed from the log")
    log = store.open(SESSION)
    inbox = Inbox(log)
    _show_inbox(inbox)

    _say(f"Timeline of {len(log)} events (kerman log show {folder} {SESSION})")
    t0 = log[0].time if len(log) else None
    for event in log.events():
        print("   " + format_event(event, t0=t0))
    log.close()


def main(args: Optional[argparse.Namespace] = None) -> int:
    """Runs the demo in ``args.dir`` (a fresh temporary folder by default)."""
    folder_arg: Any = getattr(args, "dir", None)
    if folder_arg:
        folder = Path(folder_arg)
        folder.mkdir(parents=True, exist_ok=True)
        if any(folder.iterdir()):
            print(f"kerman demo: {folder} is not empty; pass a fresh folder")
            return 2
    else:
        folder = Path(tempfile.mkdtemp(prefix="kerman-demo-"))
    print(f"Kerman demo in {folder}{os.sep}")
    asyncio.run(_run(folder))
    print(f"\nThe session file stays in {folder}; try: kerman log inbox {folder} {SESSION}")
    return 0
