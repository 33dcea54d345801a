"""``kerman chat`` asks at the prompt: while the turn waits for decisions (``docs/decisions.md``),
each pending request is shown (the tool, its exact arguments, the note) and the typed line
decides it, one request at a time."""

from __future__ import annotations

import getpass
import json
from typing import TYPE_CHECKING, Any, Dict, Optional

from .. import events
from ..decisions import Answer, Approve, Ask, Deny, Edit, PendingDecision, ToolCall
from ..errors import DecisionError
from ._timeline import terminal_text

if TYPE_CHECKING:
    from ._chat_screen import Chat

__all__ = ["Asker", "ask_every_call", "resolution_line"]

_APPROVE = ("y", "yes", "approve", "/approve")
_DENY = ("n", "no", "deny", "/deny")
_EDIT = ("e", "edit", "/edit")


async def ask_every_call(call: ToolCall, next: Any) -> Any:
    """``--approve``: a gate that asks before any call the gates after it would run."""
    verdict = await next()
    return Ask() if isinstance(verdict, Approve) else verdict


def _who() -> Optional[str]:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment: the decision is logged without one
        return None


def resolution_line(event: events.DecisionResolved) -> str:
    """How the chat shows a logged ``decision/resolved``."""
    outcome = event.outcome
    by = f" by {event.by}" if event.by else ""
    if outcome == "edited":
        return f"  ✎ edited{by}: {event.arguments}"
    if outcome == "answered":
        value = event.value
        return f"  ✓ answered{by}: {value if isinstance(value, str) else json.dumps(value)}"
    if outcome == "denied":
        return f"  ✗ denied{by}" + (f": {event.reason}" if event.reason else "")
    mark = "✓" if outcome == "approved" else "✗"
    return f"  {mark} {outcome}{by}"


def _answer_value(text: str, schema: Optional[Dict[str, Any]]) -> Any:
    """An answer as typed: text for a string schema; else JSON (text as it is when the schema
    names no type and the line is not JSON). Raises ``ValueError`` for JSON that must be."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string":
        return text
    try:
        return json.loads(text)
    except ValueError:
        if kind is None:
            return text
        raise


class Asker:
    """The requests of a waiting turn, asked one by one; ``current`` is the one on screen."""

    def __init__(self, chat: Chat) -> None:
        self.chat = chat
        self.current: Optional[PendingDecision] = None
        self.editing = False  # the next line is the edited arguments (JSON)

    @property
    def active(self) -> bool:
        return self.current is not None

    def stop(self) -> None:
        self.current = None
        self.editing = False

    def next(self) -> None:
        """Asks the oldest pending request, when the loop waits and nothing is being asked."""
        loop = self.chat.loop
        pending = loop.decisions if loop.status == "waiting" else []
        if self.current is not None and any(p.decision_id == self.current.decision_id for p in pending):
            return
        self.stop()
        if not pending:
            return
        self.current = pending[0]
        self.show(self.current, len(pending))
        self.prompt()

    def show(self, request: PendingDecision, count: int) -> None:
        chat = self.chat
        more = f" (1 of {count} waiting)" if count > 1 else ""
        if request.kind == "answer":
            chat.line(f"  ? {request.name}({request.arguments}) asks for an answer{more}")
        else:
            chat.line(f"  ? run {request.name}({request.arguments})?{more}")
        if request.note:
            chat.line(f"    note: {request.note}")
        if request.schema is not None:
            chat.line(f"    answer schema: {json.dumps(request.schema)}")
        if request.kind == "answer":
            chat.line(
                "  type the answer"
                + ("" if (request.schema or {}).get("type") == "string" else " (JSON)")
                + " · /deny [REASON] · /cancel stops the turn",
                dim=True,
            )
        else:
            chat.line("  y approve · n [REASON] deny · e [JSON] edit the arguments · /cancel stops the turn", dim=True)

    def prompt(self) -> None:
        if self.current is None:
            return
        label = "arguments (JSON)" if self.editing else "answer" if self.current.kind == "answer" else "approve? y/n/e"
        self.chat.write(f"{label}> ", bold=True)

    def handle(self, text: str) -> None:
        """One typed line while a request is asked."""
        request = self.current
        assert request is not None
        word, _, rest = text.partition(" ")
        rest = rest.strip()
        if not text:
            self.prompt()
        elif self.editing and not text.startswith("/"):
            self.edit(text)
        elif word.lower() in _DENY and (request.kind == "approval" or word == "/deny"):
            self.decide(Deny(rest or None))
        elif request.kind == "answer" and not text.startswith("/"):
            try:
                value = _answer_value(text, request.schema)
            except ValueError as error:
                self.chat.line(f"  not JSON ({error}); type the answer again")
                self.prompt()
                return
            self.decide(Answer(value))
        elif word.lower() in _APPROVE and request.kind == "approval":
            self.decide(Approve())
        elif word.lower() in _EDIT and request.kind == "approval":
            if rest:
                self.edit(rest)
            else:
                self.editing = True
                self.chat.line(f"  the arguments now: {request.arguments}", dim=True)
                self.prompt()
        elif text.startswith("/"):
            self.chat.command(text)
        else:
            self.chat.line("  y approves, n [REASON] denies, e [JSON] edits the arguments; /cancel stops the turn")
            self.prompt()

    def edit(self, text: str) -> None:
        problem: Optional[str]
        try:
            arguments = json.loads(text)
        except ValueError as error:
            arguments, problem = None, f"not JSON ({error})"
        else:
            problem = None if isinstance(arguments, dict) else "the arguments must be a JSON object"
        if problem is not None:
            self.editing = True
            self.chat.line(f"  {problem}; type the arguments again")
            self.prompt()
            return
        self.decide(Edit(arguments))

    def decide(self, outcome: Any) -> None:
        request = self.current
        assert request is not None
        self.stop()
        try:
            self.chat.loop.decide(request.decision_id, outcome, by=_who())
        except DecisionError as error:
            if error.reason == "invalid":  # an answer its schema refuses: the request is asked again
                self.chat.line(f"  not decided: {terminal_text(str(error))}")
            else:
                self.chat.line(f"  not decided: the request is {error.reason}")
        self.chat.catch_up()  # the resolution on screen before the next question
        self.next()
