"""A context plugin: a ``pre_step`` listener that rewrites the claimed batch.

A workspace watcher ``inject``s a note whenever a file changes. ``inject`` queues the note for
the next step boundary without waking the loop, so notes pile up quietly. When the user's next
prompt starts a turn, the loop claims the whole batch (the notes first, then the prompt) and the
plugin rewrites it: the individual notes are folded into one context message with the plugin's
own source, placed after the prompt. ``Enter(messages)`` is what enters the step, so the
transcript (``user/message`` events) and the model see the rewritten batch; the claim splice in
the log still records what was claimed.

A packaged, tested version of this plugin is in ``examples/plugins/`` (docs/plugins.md).

Run it: ``python examples/context_plugin.py``
"""

from __future__ import annotations

import asyncio

import kerman
from kerman.models import EchoModel

WORKSPACE = {"kind": "plugin", "plugin": "workspace"}


def install_context_folder(loop: kerman.AgentLoop) -> None:

    @loop.pre_step
    async def fold_workspace_notes(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
        decision = await next()  # what the rest of the waterfall decides (by default: enter the batch)
        if not isinstance(decision, kerman.Enter):
            return decision  # a rejection stands
        notes = [m for m in decision.messages if m.source == WORKSPACE]
        if not notes:
            return decision  # nothing to fold: enter the batch as it is
        others = [m for m in decision.messages if m.source != WORKSPACE]
        folded = kerman.UserMessage(
            "Workspace changes since your last message:\n" + "\n".join(f"- {m.text}" for m in notes),
            source={"kind": "plugin", "plugin": "context", "folded": [m.id for m in notes]},
        )
        return kerman.Enter(others + [folded])


def file_changed(loop: kerman.AgentLoop, path: str) -> None:
    """What a file watcher would call."""
    loop.inject(kerman.UserMessage(f"{path} changed", source=WORKSPACE))


def print_turn(loop: kerman.AgentLoop, turn: int) -> None:
    """Prints the user messages that entered the steps of ``turn``, from the log."""
    entered = []
    current = None
    for event in loop.log.events(types=("step/start", "user/message")):
        if event.type == "step/start":
            current = event.data["turn"]
        elif current == turn:
            entered.append(kerman.Message.from_dict(event.data))
    print(f"turn {turn}: {len(entered)} message(s) entered")
    for message in entered:
        who = str(message.source.get("plugin", message.source["kind"]))
        print(f"  [{who}] " + message.text.replace("\n", "\n  " + " " * (len(who) + 3)))


async def main() -> None:
    loop = kerman.AgentLoop(EchoModel())
    install_context_folder(loop)

    file_changed(loop, "src/loop.py")
    file_changed(loop, "README.md")
    print(f"queued quietly: {len(loop.inbox.next_step)} notes, loop {loop.status}")

    loop.followup("Review my changes")
    await loop.when_idle()
    print_turn(loop, 1)

    loop.followup("Thanks, anything else?")  # no notes pending: the batch enters unchanged
    await loop.when_idle()
    print_turn(loop, 2)
    await loop.aclose()


if __name__ == "__main__":
    asyncio.run(main())
