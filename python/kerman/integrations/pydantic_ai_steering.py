"""In-run steering under ``KermanDurability``: the run's pending messages are the session's inbox.

pydantic-ai keeps a run's pending messages (``AgentRun.enqueue``, ``RunContext.enqueue``) in
memory and delivers them at the next model request (``"asap"``) or when the agent would end
(``"when_idle"``). Under ``KermanDurability`` that queue is the Kerman session's inbox instead:

- a message is put in the inbox first (``durability.enqueue``, ``store.enqueue`` from another
  process, ``kerman serve``'s POST; or moved there from pydantic-ai's own queue at the run's
  next step), as one durable ``agent/inbox/spliced`` insert: it survives a kill;
- at each *claim point* of a run (before each model request; and when the agent would end) the
  run claims what is pending with ``inbox.claim(target, 0, by=...)``: one splice that both
  removes the messages and names the claimant, ``{"kind": "pydantic-ai", "run", "at"}`` (the
  run, and the claim point's occurrence in it). There is no second record to lose;
- a resumed run finds its claims by claimant in the log and delivers the same messages at the
  same points, without claiming again: nothing is lost and nothing is delivered twice.

``"asap"`` is the inbox's ``next-step`` list, ``"when_idle"`` its ``next-turn`` list: before a
model request the run claims ``next-step``; when it would end, all of ``next-step`` and the first
``next-turn`` prompt, which continue the run (one redirect per prompt, as Kerman runs one turn
per prompt).
"""

from __future__ import annotations

from typing import Any

import kerman

__all__ = ["KIND", "claimant", "logged_claims", "Steering"]

KIND = "pydantic-ai"
SPLICED = "agent/inbox/spliced"


def claimant(run: int, at: int) -> dict[str, Any]:
    """The ``by`` of the run's claim at claim point ``at``."""
    return {"kind": KIND, "run": run, "at": at}


def logged_claims(log: kerman.SessionLog, run: int) -> dict[int, list[kerman.UserMessage]]:
    """The messages run ``run`` claimed at each claim point, in claim order, from the log's splices
    (the claimed messages are rebuilt by folding the splices before each claim)."""
    found: dict[int, list[kerman.UserMessage]] = {}
    projection = kerman.InboxProjection()
    for event in log.events(types=[SPLICED]):
        data = event.data
        by = data.get("by") if isinstance(data, dict) else None
        if isinstance(by, dict) and by.get("kind") == KIND and by.get("run") == run and "outcome" not in data:
            pending = projection.next_step if data.get("target") == "next-step" else projection.next_turn
            start = int(data.get("start", 0))
            found.setdefault(int(by.get("at", 0)), []).extend(pending[start : start + int(data.get("removedCount", 0))])
        projection.apply(event)
    return found


def _plain_text(pending: Any) -> str | None:
    """The text of a pydantic-ai pending message that is one user prompt of text, else ``None``
    (anything else stays in pydantic-ai's queue, delivered by pydantic-ai as it is)."""
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    messages = getattr(pending, "messages", None)
    if not isinstance(messages, list) or len(messages) != 1 or not isinstance(messages[0], ModelRequest):
        return None
    parts = messages[0].parts
    if len(parts) != 1 or not isinstance(parts[0], UserPromptPart) or not isinstance(parts[0].content, str):
        return None
    if getattr(pending, "placement", "append") != "append":
        return None
    return parts[0].content


class Steering:
    """The claim points of one attempt of run ``run``: their counter, and the claims an earlier
    attempt logged (``resumed``: this attempt resumes the run)."""

    def __init__(self, inbox: kerman.Inbox, run: int, *, resumed: bool) -> None:
        self.inbox = inbox
        self.run = run
        # A run that does not resume one has no earlier attempt, so no claims of its own yet.
        self.logged = logged_claims(inbox.log, run) if resumed else {}
        self.points = 0

    def adopt(self, ctx: Any) -> None:
        """Moves the plain user prompts waiting in pydantic-ai's own queue (``AgentRun.enqueue``)
        into the inbox, each with its priority's list, so they are logged and claimed like the
        rest."""
        queue = getattr(ctx, "pending_messages", None)
        if not isinstance(queue, list) or not queue:
            return
        for pending in list(queue):
            text = _plain_text(pending)
            if text is None:
                continue
            # Inserted first, then taken out of pydantic-ai's queue: a crash in between leaves it
            # in the inbox (durable) rather than nowhere.
            self.inbox.append("next-turn" if pending.priority == "when_idle" else "next-step", text)
            ctx.dequeue(pending.enqueue_id)

    def passes(self, *, caught_up: bool) -> bool:
        """Whether this claim point has nothing to deliver, so that it is passed (counted) without
        a claim: no claim of an earlier attempt is logged at it, and either this attempt still
        replays or the inbox holds nothing. The inbox's lists are what a claim would read (what
        other processes stage lands in them before a claim could take it), so a claim here would
        take nothing and append nothing. Otherwise ``take`` delivers the point's messages."""
        at = self.points
        if at in self.logged or (caught_up and self.inbox.has_pending):
            return False
        self.points = at + 1
        return True

    async def take(self, *, caught_up: bool, at_end: bool) -> list[kerman.UserMessage]:
        """The messages of this claim point: logged by an earlier attempt, or claimed now (one
        splice naming the claimant). A point an earlier attempt passed without claiming, while
        this attempt replays logged units, claims nothing: what it would deliver would meet a
        model response already logged, so it waits for the next point."""
        at = self.points
        self.points += 1
        if at in self.logged:
            return self.logged[at]
        if not caught_up:
            return []
        claimed = self.inbox.claim("next-turn" if at_end else "next-step", 0, by=claimant(self.run, at))
        if claimed:
            await self._claimed()
        return claimed

    async def _claimed(self) -> None:
        """Called after a claim that took something (the crash tests stop the process here)."""
