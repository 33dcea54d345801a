"""The terminal side of ``kerman chat``: one chat's renderer (a reader of ``log.tail()``), its
commands, and the banner of a resumed session."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, Callable, Dict, List, TextIO, Tuple

from .. import AgentLoop, FileStore, Retry, SessionLog, events
from ..hooks import Model, RequestFailure
from ._chat_decide import Asker, resolution_line
from ._timeline import message_text, summarize, terminal_text

__all__ = ["Chat"]

_HELP = """commands:
  TEXT              while the agent works: steer it (seen at the next step); else: a new turn
  /followup TEXT    queue TEXT as a prompt for its own turn, after the running one
  /queue            list the queued input with its ids
  /drop ID          remove queued input (ID as /queue shows it, or the full message id)
  /clear            remove all queued input
  /cancel           stop the running turn; queued input stays queued
  y, n [REASON], e [JSON]
                    while a tool call waits for a decision: approve it, deny it, edit its
                    arguments (/deny [REASON] declines a question; its answer is the line)
  /run              start a turn for input queued before (e.g. from a resumed session)
  /resend [TURN]    send again what a turn claimed but never read (a prompt cancelled before
                    the agent read it); default: the last such turn
  /help             this list
  /quit             leave (also Ctrl-D); the session stays on disk for --session"""


def _clean(text: str) -> str:
    # Terminal control characters and bidi controls in anything printed (model output, ids,
    # tool names, errors) are shown escaped, never obeyed: a model, a tool result it quotes or
    # another program's queued input must not move the cursor, clear or retitle the terminal,
    # or reorder what it shows.
    return terminal_text(text)


class _Style:
    """ANSI styles when the output is a terminal (and NO_COLOR is unset); plain text otherwise."""

    def __init__(self, out: TextIO) -> None:
        tty = hasattr(out, "isatty") and out.isatty()
        self.on = bool(tty) and not os.environ.get("NO_COLOR")

    def dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.on else text

    def bold(self, text: str) -> str:
        return f"\x1b[1m{text}\x1b[0m" if self.on else text


def progress_line(event: events.ToolProgress, width: int = 20) -> str:
    """A running call's progress as the chat draws it: a bar and the percentage when the
    total is known (``⋯`` and the count otherwise), then the message (``tool/progress``)."""
    fraction = event.fraction
    if fraction is not None:
        filled = min(width, max(0, round(fraction * width)))
        text = f"[{'#' * filled}{'-' * (width - filled)}] {round(fraction * 100):3d}%"
    else:
        text = f"⋯ {event.progress:g}"
    if event.message:
        text += f" {_one_line(event.message, 60)}"
    if event.task:
        text += f" (task {_one_line(event.task, 40)})"
    return text


def _tag(message_id: str) -> str:
    """The short id ``/queue`` shows: the last 6 characters (a UUIDv7's start is its timestamp)."""
    return message_id[-6:]


def _one_line(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Chat:
    """One chat: the loop, the terminal renderer (a reader of ``log.tail()``) and the commands."""

    def __init__(self, loop: AgentLoop, out: TextIO, resumed: bool, echo: bool = True) -> None:
        self.loop = loop
        self.echo = echo  # whether the input is a terminal, which echoes each line and its newline
        self.out = out
        self.style = _Style(out)
        self.resumed = resumed
        self.quit = asyncio.Event()
        self.typed: set[str] = set()  # ids of prompts the user typed at idle (already on screen)
        self.column = 0  # characters on the current line of streamed text
        self.streamed = False  # whether this step's reply arrived as chunks
        self.queue_shown: Tuple[str, ...] = ()
        self.step = 0  # the step being shown: input entering at step 1 is a prompt, later a steer
        self.cancelling = False
        self.seen = -1  # the last seq shown
        self.asker = Asker(self)  # the decisions of a waiting turn, asked at the prompt
        self.usage: Any = None  # with --usage: the ledger's fold (kerman.usage.Fold), fed every event shown

    def track_usage(self) -> None:
        """Shows each turn's usage when it ends (``kerman chat --usage``), from the events shown."""
        from ..usage import Fold, default_pricer
        from ..usage._prices import model_of

        name, provider = model_of(getattr(self.loop, "_model", None))
        self.usage = Fold(default_pricer(), name, provider)
        for event in self.loop.log.events(stop=self.seen + 1, view=True):
            self.usage.add(event)

    # -- output --

    def write(self, text: str, dim: bool = False, bold: bool = False) -> None:
        """Every print of the chat goes through here: ``text`` is escaped (``_clean``), then
        styled."""
        if not text:
            return
        shown = _clean(text)
        self.column = 0 if shown.endswith("\n") else self.column + len(shown)
        if dim:
            shown = self.style.dim(shown)
        if bold:
            shown = self.style.bold(shown)
        self.out.write(shown)
        self.out.flush()

    def line(self, text: str, dim: bool = False) -> None:
        """A line of its own (ending any streamed text first)."""
        if self.column:
            self.write("\n")
        self.write(text, dim=dim)
        self.write("\n")

    def prompt(self) -> None:
        if self.echo:
            self.write("> ", bold=True)

    # -- the renderer: the log, event by event --

    async def render(self, start: int) -> None:
        async for event in self.loop.log.tail(start=start, view=True):
            if event.seq <= self.seen:
                continue  # shown already by catch_up (before a decision was asked)
            self.seen = event.seq
            self.show(event)

    def catch_up(self) -> None:
        """Shows what the renderer has not reached yet (at exit, after the loop closed)."""
        for event in self.loop.log.events(start=self.seen + 1, view=True):
            self.seen = event.seq
            self.show(event)

    def waiting(self) -> None:
        """The turn waits for decisions: what led to them is shown first, then the first is asked."""
        if self.loop.status == "waiting" and not self.asker.active:
            self.catch_up()
            self.asker.next()

    def show(self, event: events.EventView) -> None:
        if self.usage is not None:
            self.usage.add(event)
        if isinstance(event, events.AssistantChunk):
            chunk = event.chunk
            if isinstance(chunk, events.TextDelta):
                self.streamed = True
                self.write(chunk.text)
            elif isinstance(chunk, events.ReasoningDelta):
                self.streamed = True
                self.write(chunk.text, dim=True)
            elif isinstance(chunk, events.FinishChunk) and chunk.reason not in ("stop", "max-tokens"):
                self.streamed = False  # a failed attempt: the next message is the retry's
        elif isinstance(event, events.AssistantMessageEvent):
            message = event.message
            if not self.streamed:
                text = message_text(message)
                if text:
                    self.write(text)
            for call in message.tool_calls:
                self.line(f"  ⚙ {_one_line(call.name)}({_one_line(str(call.arguments), 60)})", dim=True)
            if event.interrupted:
                self.line("  (interrupted)", dim=True)
            self.streamed = False
        elif isinstance(event, events.ToolProgress):
            self.line(f"  {progress_line(event)}", dim=True)
        elif isinstance(event, events.ToolResultEvent):
            text = message_text(event.message)
            mark = "✗" if event.error is not None else "↳"
            self.line(f"  {mark} {_one_line(text, 80)}", dim=True)
        elif isinstance(event, events.UserMessageEvent):
            message = event.message
            if message.id in self.typed:
                self.typed.discard(message.id)
            else:
                source = message.source.kind or "user"
                label = ("prompt" if self.step <= 1 else "steer") if source == "user" else _one_line(source, 20)
                self.line(f"  » {label}: {_one_line(message_text(message))}", dim=True)
        elif isinstance(event, events.StepStart):
            self.step = event.step
        elif isinstance(event, events.TurnStart):
            if event.continues is not None:  # the history as logged is asked again: say why
                self.line(f"  [turn {event.turn} continues turn {event.continues}, which a crash interrupted]", dim=True)
        elif isinstance(event, events.ContextCompacted):
            # The history the model sees changed: the span replaced and by what, as `kerman log show` says it.
            self.line(f"  [context compacted: {summarize(event)}]", dim=True)
        elif isinstance(event, events.TurnEnd):
            self.cancelling = False
            self.asker.stop()
            self.show_usage(event)
            self.turn_ended(event)
        elif isinstance(event, events.InboxSpliced):
            self.queue_changed()
        elif isinstance(event, events.DecisionResolved):
            self.line(resolution_line(event), dim=True)

    def show_usage(self, event: events.TurnEnd) -> None:
        """With ``--usage``: the ended turn's requests, tokens and cost on one dim line."""
        if self.usage is None:
            return
        from ..usage import Totals

        totals = sum((r.totals for r in self.usage.requests if r.turn == event.turn), Totals())
        calls = sum(n for (turn, _), n in self.usage.tool_calls.items() if turn == event.turn)
        totals = totals + Totals(tool_calls=calls)
        self.line(f"  [turn {event.turn} usage: {totals.summary()}]", dim=True)

    def turn_ended(self, event: events.TurnEnd) -> None:
        reason = event.reason
        what = reason.kind
        error = reason.error
        if what == "completed":
            note = ""
        elif reason.rolled_back:
            note = "rolled back: out of the history from here"
        elif what == "aborted":
            note = "cancelled"
        elif what == "error":
            message, code = (error.message, error.code or "UNKNOWN") if error is not None else ("", "UNKNOWN")
            note = f"error: {_one_line(message, 200)} [{_one_line(code, 40)}]"
        elif what == "budget" and reason.budget is not None:
            note = f"stopped, budget spent: {_one_line(reason.budget.text(), 200)}"
        else:
            note = _one_line(json.dumps(reason.raw, default=str))
        if note:
            self.line(f"  [turn {event.turn} {note}]", dim=True)
        elif self.column:
            self.write("\n")
        if what != "completed":  # a completed turn read its input
            self.show_unread(event.turn)
        if not self.loop.inbox.has_pending:
            self.prompt()
        elif what != "completed":  # a completed turn's queue runs on; a stopped one waits
            self.line(f"  {self.queue_summary()} kept; Enter (or /run) runs it, /clear drops it", dim=True)
            self.prompt()

    def unread(self) -> List[Dict[str, Any]]:
        """What ended turns claimed and never read (``Transcript.unread()``)."""
        return self.loop.log.transcript().unread()

    def show_unread(self, turn: object = None) -> None:
        """Input claimed and never read (cancelled before the agent read it) is not queued any
        more and not in the conversation: said here, with the command that sends it again."""
        for item in self.unread():
            if turn is None or item["turn"] == turn:
                kind = str((item["ending"] or {}).get("kind"))
                what = {"aborted": "cancelled", "blocked": "rejected", "budget": "stopped by the budget"}.get(
                    kind, f"turn {_one_line(kind, 20)}"
                )
                self.line(
                    f"  {what} before it was read: {_one_line(item['message'].text or '', 80)} — /resend {item['turn']} sends it again",
                    dim=True,
                )

    def resend(self, wanted: str) -> None:
        turns = sorted({item["turn"] for item in self.unread()})
        if wanted and not wanted.isdigit():
            self.line("usage: /resend [TURN]")
            return
        turn = int(wanted) if wanted else (turns[-1] if turns else None)
        if turn is None or turn not in turns:
            self.line("  nothing to resend: no turn left input unread" if turn is None else f"  turn {turn} left nothing unread", dim=True)
            return
        requeued = self.loop.requeue_claimed(turn)
        self.line(f"  sent again: {', '.join(_one_line(m.text or '', 40) for m in requeued)}", dim=True)
        if self.loop.status == "idle":
            self.loop.wake()

    def queue_changed(self) -> None:
        ids = tuple(m.id for m in self.loop.inbox.next_turn + self.loop.inbox.next_step)
        if ids == self.queue_shown:
            return
        # Shown when it grows (input was queued); a queue that empties as the loop takes its
        # input is announced by the user/message lines instead.
        grew = any(i not in self.queue_shown for i in ids)
        self.queue_shown = ids
        if grew:
            self.line("  " + self.queue_summary(), dim=True)

    def queue_summary(self) -> str:
        inbox = self.loop.inbox
        items = [("next turn", m) for m in inbox.next_turn] + [("next step", m) for m in inbox.next_step]
        if not items:
            return "queue: empty"
        shown = ", ".join(f"#{_tag(m.id)} {_one_line(m.text or '', 30)!s}" for _, m in items[:3])
        more = f" (+{len(items) - 3} more)" if len(items) > 3 else ""
        return f"queue ({len(items)}): {shown}{more} — /queue, /drop ID"

    # -- input --

    def handle(self, line: str) -> None:
        """One typed line."""
        if self.echo:
            self.column = 0  # the terminal's echo of the Enter key ended the line
        text = line.strip()
        if self.asker.active:
            self.asker.handle(text)
            return
        if not text:
            if self.loop.status == "idle" and self.loop.inbox.has_pending:
                self.loop.wake()
            elif self.loop.status == "idle":
                self.prompt()
            return
        if text.startswith("/"):
            self.command(text)
            return
        if self.loop.status == "idle":
            self.typed.add(self.loop.followup(text).id)
        else:
            self.loop.steer(text)

    def command(self, text: str) -> None:
        name, _, rest = text.partition(" ")
        rest = rest.strip()
        if name in ("/quit", "/exit"):
            self.quit.set()
        elif name == "/help":
            self.line(_HELP)
        elif name == "/queue":
            self.line(self.queue_listing())
        elif name == "/drop":
            self.drop(rest)
        elif name == "/clear":
            dropped = self.loop.inbox.clear()
            self.line(f"  removed {len(dropped)} queued message{'s' if len(dropped) != 1 else ''}", dim=True)
        elif name == "/cancel":
            if self.loop.status == "idle":
                self.line("  nothing is running", dim=True)
            else:
                self.cancel()
        elif name == "/followup":
            if not rest:
                self.line("usage: /followup TEXT")
            else:
                message = self.loop.followup(rest)
                if self.loop.status == "idle":
                    self.typed.add(message.id)
        elif name == "/resend":
            self.resend(rest)
        elif name == "/run":
            if not self.loop.wake():
                self.line("  nothing to run" if not self.loop.inbox.has_pending else "  already running", dim=True)
        else:
            self.line(f"unknown command {_one_line(name, 30)!r}; /help lists them")
        if self.quit.is_set():
            return
        if self.asker.active:
            self.asker.prompt()
        elif self.loop.status == "idle":
            self.prompt()

    async def on_request_error(self, failure: RequestFailure, next: Callable[[], Any]) -> Any:
        """First in the ``request_error`` waterfall: says on screen when the policy retries."""
        decision = await next()
        if isinstance(decision, Retry):
            f = failure.failure
            self.line(f"  [retrying: {_one_line(str(f.get('message', '')), 120)}]", dim=True)
        return decision

    def cancel(self) -> None:
        self.cancelling = True
        self.asker.stop()
        self.loop.cancel("user", keep_inbox=True)

    def queue_listing(self) -> str:
        inbox = self.loop.inbox
        rows = [f"  #{_tag(m.id)}  next turn  {_one_line(m.text or '', 70)}" for m in inbox.next_turn]
        rows += [f"  #{_tag(m.id)}  next step  {_one_line(m.text or '', 70)}" for m in inbox.next_step]
        return "\n".join(rows) if rows else "  queue: empty"

    def drop(self, wanted: str) -> None:
        wanted = wanted.lstrip("#")
        if not wanted:
            self.line("usage: /drop ID (as /queue shows it)")
            return
        inbox = self.loop.inbox
        # The id as typed, or as shown (escaped: an id holding control characters).
        matches = [m for m in inbox.next_turn + inbox.next_step if m.id == wanted or m.id.endswith(wanted) or _clean(m.id).endswith(wanted)]
        if not matches:
            self.line(f"  no queued message #{_one_line(wanted, 40)} (it may have been delivered already); /queue lists them")
        elif len(matches) > 1:
            self.line(f"  #{_one_line(wanted, 40)} matches {len(matches)} messages; give more of the id")
        elif inbox.remove(matches[0].id):
            self.line(f"  removed #{_tag(matches[0].id)} {_one_line(matches[0].text or '', 60)}", dim=True)
        else:  # taken by the loop between the listing and the removal
            self.line(f"  #{_tag(matches[0].id)} was delivered before it could be removed")

    def banner(self, log: SessionLog, model: Model, store: FileStore) -> None:
        if self.resumed:
            history = _recent(log)
            self.line(f"resumed session {log.id} ({len(log)} events)", dim=True)
            for role, text in history:
                self.line(f"  {role}: {_one_line(text, 100)}", dim=True)
        else:
            self.line(f"session {log.id}", dim=True)
        self.line(f"model {_one_line(repr(model), 100)} · store {store.root} · /help for commands", dim=True)
        if self.resumed:
            self.show_unread()
        pending = self.loop.inbox
        if pending.has_pending:
            self.line("  " + self.queue_summary() + "; press Enter (or /run) to run it", dim=True)
            self.line(self.queue_listing())
            self.queue_shown = tuple(m.id for m in pending.next_turn + pending.next_step)


def _recent(log: SessionLog, count: int = 4) -> List[Tuple[str, str]]:
    """The last ``count`` user and assistant texts, for a resumed session's banner."""
    found: List[Tuple[str, str]] = []
    for event in reversed(list(log.events(types=[events.USER_MESSAGE, events.ASSISTANT_MESSAGE], view=True))):
        if not isinstance(event, (events.UserMessageEvent, events.AssistantMessageEvent)):
            continue
        text = message_text(event.message)
        if text:
            found.append(("you" if isinstance(event, events.UserMessageEvent) else "agent", text))
        if len(found) >= count:
            break
    return list(reversed(found))
