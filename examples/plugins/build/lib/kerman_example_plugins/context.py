"""A context folder: workspace notes injected between prompts enter as one message.

A file watcher calls ``file_changed(loop, path)``, which ``inject``s a note (next-step, no
wake). When the next prompt's turn claims its batch, ``fold_notes`` rewrites the decision the
rest of the waterfall made: the notes become one context message after the other messages,
with this plugin's source. It calls ``next()`` first, so a guard registered before it still
sees the notes and a rejection downstream stands.
"""

from __future__ import annotations

import kerman

NOTE = {"kind": "plugin", "plugin": "workspace"}
CONTEXT = {"kind": "plugin", "plugin": "context"}


def file_changed(loop: kerman.AgentLoop, path: str) -> kerman.UserMessage:
    """What a file watcher would call: queues a note for the next step, without waking."""
    return loop.inject(kerman.UserMessage(f"{path} changed", source=NOTE))


async def fold_notes(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
    decision = await next()
    if not isinstance(decision, kerman.Enter):
        return decision
    notes = [m for m in decision.messages if m.source == NOTE]
    if not notes:
        return decision
    others = [m for m in decision.messages if m.source != NOTE]
    folded = kerman.UserMessage(
        "Workspace changes since your last message:\n" + "\n".join(f"- {m.text}" for m in notes),
        source={**CONTEXT, "folded": [m.id for m in notes]},
    )
    return kerman.Enter([*others, folded])


def install(loop: kerman.AgentLoop) -> None:
    loop.pre_step(fold_notes)
