"""The HTML views Jupyter shows (``_repr_html_``) of Kerman's objects: messages, events, session
logs, event iterators, inboxes and projections, transcripts and ``AgentLoop``.

One module for all of them, native classes included (their ``_repr_html_`` calls the function
of the same name here), so the two rules are written once: every string that came from a user, a
model or a log is escaped (a message text with ``<script>`` shows as text), and what is shown is
bounded (a log of 100k events shows its last few, a huge message is cut with a note saying how
much was left out). Display only: nothing here is on a hot path, and nothing here changes what
it shows (an iterator is peeked at, not advanced).
"""

from __future__ import annotations

import html
import json
from typing import Any, Dict, Iterable, List, Optional, Sequence

from . import _doubt, events

# The events a log's calls in doubt are read from (step boundaries end a call's step).
_DOUBT_TYPES = ["turn/start", "turn/end", "step/start", "step/end", "tool/call", "tool/result"]

__all__ = ["message", "event", "event_iterator", "session_log", "inbox", "transcript", "agent_loop", "usage_ledger"]

#: How much of one message's text is shown before it is cut.
TEXT_LIMIT = 2000
#: How much of a JSON value (event data, tool-call arguments) is shown.
JSON_LIMIT = 300
#: Events a session log or an iterator shows (the last or the next ones).
EVENTS_SHOWN = 5
#: Messages a transcript shows (the last ones), and pending messages per inbox list.
MESSAGES_SHOWN = 50
PENDING_SHOWN = 20
#: Turns the usage ledger's view shows (the last ones).
TURNS_SHOWN = 20

_STYLE = (
    "<style>"
    ".kerman{font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;line-height:1.4}"
    ".kerman table{border-collapse:collapse}"
    ".kerman td,.kerman th{padding:2px 8px;text-align:left;vertical-align:top;border-bottom:1px solid #8884}"
    ".kerman .k-head{font-weight:600;margin-bottom:4px}"
    ".kerman .k-dim{opacity:.65}"
    ".kerman .k-note{opacity:.65;font-style:italic}"
    ".kerman .k-msg{border-radius:8px;padding:6px 10px;margin:4px 0;max-width:48em;border:1px solid #8884}"
    ".kerman .k-user{background:#3b82f61a;margin-left:4em}"
    ".kerman .k-assistant{background:#8881}"
    ".kerman .k-tool{background:#f59e0b14;font-family:var(--jp-code-font-family,monospace);font-size:12px}"
    ".kerman .k-error{border-color:#dc2626}"
    ".kerman .k-text{white-space:pre-wrap;word-break:break-word}"
    ".kerman code,.kerman pre{font-family:var(--jp-code-font-family,monospace);font-size:12px;white-space:pre-wrap;"
    "word-break:break-word;margin:0}"
    ".kerman .k-end{text-align:center;opacity:.75;font-size:12px;margin:6px 0}"
    ".kerman .k-doubt{color:#b45309;font-weight:600}"
    "</style>"
)


def esc(value: Any) -> str:
    """``value`` as text safe inside HTML elements and attribute values."""
    return html.escape(value if isinstance(value, str) else str(value), quote=True)


def clip(text: str, limit: int) -> str:
    """``text`` escaped, cut at ``limit`` characters with a note of how many were left out."""
    if len(text) <= limit:
        return esc(text)
    return f'{esc(text[:limit])}<span class="k-note">… ({len(text) - limit:,} more characters not shown)</span>'


def json_text(value: Any, limit: int = JSON_LIMIT) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError):
        text = repr(value)
    return f"<code>{clip(text, limit)}</code>"


def _box(head: str, body: str) -> str:
    return f'<div class="kerman">{_STYLE}<div class="k-head">{head}</div>{body}</div>'


def _label(name: str, value: Any) -> str:
    return f'<span class="k-dim">{esc(name)}</span> {esc(value)}'


# ---- messages -------------------------------------------------------------------------------


def _blocks(blocks: Iterable[Any]) -> str:
    """The content blocks of a message: text as text, tool calls and results by name."""
    parts: List[str] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(f'<div class="k-text">{clip(str(block.get("text", "")), TEXT_LIMIT)}</div>')
        elif kind == "reasoning":
            parts.append(f'<div class="k-text k-dim">reasoning: {clip(str(block.get("text", "")), TEXT_LIMIT)}</div>')
        elif kind == "tool-call":
            args = block.get("arguments")
            parts.append(
                f'<div class="k-tool">→ <b>{esc(block.get("name", "?"))}</b> '
                f"{json_text(args) if not isinstance(args, str) else f'<code>{clip(args, JSON_LIMIT)}</code>'} "
                f'<span class="k-dim">{esc(block.get("id", ""))}</span></div>'
            )
        elif kind == "tool-result":
            inner = block.get("content")
            parts.append(_blocks(inner if isinstance(inner, list) else []))
        else:
            parts.append(f'<div class="k-dim">[{esc(kind or "block")}]</div>')
    return "".join(parts)


def _role(m: Any) -> str:
    source = m.source
    if source.get("kind") == "tool":
        return "tool"
    return str(m.role)


def _message_div(m: Any, note: str = "") -> str:
    role = _role(m)
    source = m.source
    css = {"user": "k-user", "assistant": "k-assistant", "tool": "k-tool"}.get(role, "k-assistant")
    error = role == "tool" and any(isinstance(b, dict) and b.get("isError") for b in m.content)
    title = esc(role)
    if role == "tool":
        title += f' <span class="k-dim">{esc(source.get("callId", ""))}</span>'
        if error:
            title += " <b>error</b>"
    elif source.get("kind") not in (None, "user", "model"):
        title += f' <span class="k-dim">({esc(source.get("kind"))}{": " + esc(source["plugin"]) if "plugin" in source else ""})</span>'
    if note:
        title += f' <span class="k-note">{esc(note)}</span>'
    return (
        f'<div class="k-msg {css}{" k-error" if error else ""}" title="{esc(m.id)}">'
        f'<div class="k-dim">{title}</div>{_blocks(m.content)}</div>'
    )


def message(m: Any) -> str:
    """A message as a chat bubble: its role (and source), its text, tool calls and results."""
    return f'<div class="kerman">{_STYLE}{_message_div(m)}</div>'


# ---- events, logs, iterators ----------------------------------------------------------------


def _event_rows(shown: Sequence[Any], marks: Optional[Dict[int, str]] = None) -> str:
    marks = marks or {}

    def mark(ev: Any) -> str:
        text = marks.get(ev.seq)
        return f'<div class="k-doubt">⚠ {esc(text)}</div>' if text else ""

    rows = "".join(f"<tr><td>{ev.seq}</td><td><code>{esc(ev.type)}</code></td><td>{json_text(ev.data)}{mark(ev)}</td></tr>" for ev in shown)
    return f"<table><tr><th>seq</th><th>type</th><th>data</th></tr>{rows}</table>"


def _doubt_note(marks: Dict[int, str]) -> str:
    """A line over a log's table counting its calls in doubt and outcome-unknown results."""
    if not marks:
        return ""
    open_ = sum(1 for text in marks.values() if text.startswith("IN DOUBT"))
    unknown = len(marks) - open_
    parts = [f"{n} {what}" for n, what in ((open_, "call(s) in doubt (no result)"), (unknown, "outcome(s) unknown")) if n]
    return f'<div class="k-doubt">⚠ {esc(", ".join(parts))}</div>'


def event(ev: Any) -> str:
    """One event: seq, type, time and (cut) data."""
    head = f"Event {_label('seq', ev.seq)} {_label('type', ev.type)} {_label('time', ev.time)}"
    return _box(head, json_text(ev.data, JSON_LIMIT * 4))


def session_log(log: Any) -> str:
    """A session log: its id, store, length, state and its last few events."""
    n = len(log)
    state = "closed" if log.closed else "open"
    head = f"SessionLog {_label('id', log.id)} {_label('store', log._store or '?')} {_label('events', n)} {_label('state', state)}"
    start = max(0, n - EVENTS_SHOWN)
    shown = list(log.events(start=start))
    note = f'<div class="k-note">the last {len(shown)} of {n:,} events</div>' if start else ""
    marks = _doubt.marks(log.events(types=_DOUBT_TYPES)) if n else {}
    body = _doubt_note(marks) + note + _event_rows(shown, marks) if shown else '<div class="k-note">no events yet</div>'
    return _box(head, body)


def usage_ledger(book: Any) -> str:
    """A usage ledger: the session's totals, then one row per turn (the last few)."""
    head = f"Ledger {_label('turns', len(book.turns))} {_label('requests', book.session.requests)}"
    turns = list(book.turns.items())
    shown = turns[-TURNS_SHOWN:]
    note = f'<div class="k-note">the last {len(shown)} of {len(turns):,} turns</div>' if len(shown) < len(turns) else ""

    def row(name: Any, t: Any) -> str:
        cost = "unknown" if t.cost is None else f"${t.cost:.4f}"
        return (
            f"<tr><td>{esc(name)}</td><td>{t.requests}</td><td>{t.failed}</td><td>{t.input:,}</td><td>{t.cache_read:,}</td>"
            f"<td>{t.cache_write:,}</td><td>{t.output:,}</td><td>{t.reasoning:,}</td><td>{t.tool_calls}</td><td>{esc(cost)}</td></tr>"
        )

    rows = "".join(row(turn, t) for turn, t in shown) + row("session", book.session)
    table = (
        "<table><tr><th>turn</th><th>requests</th><th>failed</th><th>input</th><th>cache read</th><th>cache write</th>"
        f"<th>output</th><th>reasoning</th><th>tool calls</th><th>cost</th></tr>{rows}</table>"
    )
    return _box(head, note + table)


def event_iterator(it: Any) -> str:
    """An event iterator: where it is, what is left, and the next few events (not consumed)."""
    session, nxt, stop = it._position
    remaining = it._remaining()
    head = f"EventIterator {_label('session', session)} {_label('next seq', nxt)} {_label('stop', stop)} {_label('left', remaining)}"
    preview = it._peek(EVENTS_SHOWN)
    if not preview:
        return _box(head, '<div class="k-note">exhausted</div>')
    more = remaining - len(preview)
    note = f'<div class="k-note">the next {len(preview)}; {more:,} more after them</div>' if more > 0 else ""
    return _box(head, _event_rows(preview) + note)


# ---- the inbox --------------------------------------------------------------------------------


def _pending(title: str, messages: Sequence[Any]) -> str:
    shown = messages[:PENDING_SHOWN]
    items = "".join(f"<li>{_message_div(m)}</li>" for m in shown)
    more = f'<div class="k-note">{len(messages) - len(shown):,} more not shown</div>' if len(messages) > len(shown) else ""
    empty = '<div class="k-note">empty</div>' if not messages else ""
    return (
        f'<td style="min-width:20em"><div class="k-head">{esc(title)} ({len(messages)})</div>'
        f'<ol style="margin:0;padding-left:1.5em">{items}</ol>{more}{empty}</td>'
    )


def inbox(x: Any) -> str:
    """An ``Inbox`` or ``InboxProjection``: the two pending lists as a queue, oldest first."""
    kind = type(x).__name__
    head = kind
    log = getattr(x, "log", None)
    if log is not None:
        head += " " + _label("session", log.id)
    if getattr(x, "closed", False):
        head += " " + _label("state", "closed")
    body = (
        f"<table><tr>{_pending('next step (steering, context)', x.next_step)}"
        f"{_pending('next turn (queued prompts)', x.next_turn)}</tr></table>"
    )
    return _box(head, body)


# ---- the transcript -------------------------------------------------------------------------


def _reason(end: Dict[str, Any]) -> events.Ending:
    """The typed reason of a transcript's turn ending (``{seq, turn, reason}``)."""
    reason = end.get("reason")
    return events.Ending(reason if isinstance(reason, dict) else {})


def _ending(end: Dict[str, Any]) -> str:
    ending = _reason(end)
    kind = ending.kind or "?"
    text = f"turn {end.get('turn')} ended: {kind}"
    error, cause = ending.error, ending.cause
    if kind == "blocked" and ending.blocked_reason:
        text += f" ({ending.blocked_reason})"
    elif kind == "error" and error is not None:
        text += f" ({error.code or ''}: {error.message})"
    elif kind == "aborted" and cause is not None:
        text += f" ({cause.kind or ''})"
    elif kind == "budget" and ending.budget is not None:
        text += f" ({ending.budget.text()})"
    if ending.rolled_back:
        text += "; rolled back: its messages are out of the history"
    return f'<div class="k-end">— {clip(text, 300)} —</div>'


def transcript(t: Any) -> str:
    """The conversation as a chat: messages in order, a line where a turn ended other than
    ``completed`` (blocked, error, aborted, interrupted), steering and cut-off replies marked."""
    entries = t.entries()
    endings = [e for e in t.endings if _reason(e).kind != "completed"]
    shown = entries[-MESSAGES_SHOWN:]
    first_seq = shown[0]["seq"] if shown and len(shown) < len(entries) else -1
    rolled_back = {e.get("turn") for e in t.endings if _reason(e).rolled_back}
    items = [(e["seq"], _message_div(e["message"], _entry_note(e, rolled_back))) for e in shown]
    items += [(e["seq"], _ending(e)) for e in endings if e["seq"] > first_seq]
    items.sort(key=lambda item: item[0])
    head = f"Transcript {_label('session', t.session_id)} {_label('messages', len(entries))} {_label('turns', len(t.endings))}"
    note = f'<div class="k-note">the last {len(shown)} of {len(entries):,} messages</div>' if len(shown) < len(entries) else ""
    body = note + "".join(html_ for _, html_ in items) if items else '<div class="k-note">no messages yet</div>'
    return _box(head, body)


def _entry_note(entry: Dict[str, Any], rolled_back: Any = frozenset()) -> str:
    notes = []
    if entry["turn"] in rolled_back:
        notes.append("rolled back")
    if entry["mid_turn"]:
        notes.append(f"entered at step {entry['step']} (steering)")
    if entry["interrupted"]:
        notes.append("interrupted")
    return ", ".join(notes)


# ---- AgentLoop --------------------------------------------------------------------------------


def agent_loop(loop: Any, usage: str = "") -> str:
    """An ``AgentLoop``: status, turn and step, pending input, tools, listeners and ``usage`` (the
    session's usage in one line, ``Totals.summary()``)."""
    inbox_ = loop.inbox
    head = (
        f"AgentLoop {_label('session', loop.log.id)} {_label('status', loop.status)} "
        f"{_label('turn', loop.turn)} {_label('step', loop.step)}"
    )
    if loop.closed:
        head += " " + _label("state", "closed")
    tools = ", ".join(esc(name) for name in loop.tools) or '<span class="k-note">none</span>'
    seams = loop._listener_counts()
    listeners = ", ".join(f"{esc(name)} ×{n}" for name, n in seams.items() if n) or '<span class="k-note">none</span>'
    rows = (
        f"<tr><th>pending</th><td>{len(inbox_.next_turn)} next turn, {len(inbox_.next_step)} next step</td></tr>"
        f"<tr><th>tools</th><td>{tools}</td></tr>"
        f"<tr><th>listeners</th><td>{listeners}</td></tr>"
    )
    pending = loop.decisions if loop.status == "waiting" else []
    if pending:
        items = "".join(
            f'<li><code>{esc(d.name)}</code> {json_text(d.arguments)} <span class="k-note">{esc(d.kind)}'
            f"{' — ' + esc(d.note) if d.note else ''} · {esc(d.decision_id)}</span></li>"
            for d in pending
        )
        rows += f"<tr><th>waiting for</th><td><ul>{items}</ul></td></tr>"
    doubt = loop.in_doubt
    if doubt:
        items = "".join(
            f'<li><code>{esc(c["name"])}</code> <span class="k-dim">{esc(c["call_id"])} · seq {c["seq"]}</span> '
            f"on_in_doubt={esc(c['policy'])}</li>"
            for c in doubt
        )
        rows += (
            f'<tr><th class="k-doubt">⚠ in doubt</th><td><div class="k-doubt">logged, no result: '
            f"may or may not have run (loop.resolve records one)</div><ul>{items}</ul></td></tr>"
        )
    if usage:
        rows += f"<tr><th>usage</th><td>{esc(usage)}</td></tr>"
    crashed = loop._core.continuation
    if crashed is not None:
        rows += f"<tr><th>crashed</th><td>{esc(_crashed(loop, *crashed))}</td></tr>"
    budget = getattr(loop, "budget", None)
    if budget is not None:
        rows += f"<tr><th>budget</th><td>{esc(repr(budget))}</td></tr>"
    rows += _history_row(loop)
    error = loop.last_error
    if error is not None:
        rows += f"<tr><th>last error</th><td>{clip(str(error.error.get('message', error.error)), 300)}</td></tr>"
    return _box(head, f"<table>{rows}</table>")


def _crashed(loop: Any, turn: int, crashes: int) -> str:
    """What becomes of the input a crash left unanswered (docs/durability.md)."""
    text = f"turn {turn} was interrupted with its input unanswered"
    if crashes > 1:
        text += f" ({crashes} crashed turns in a row)"
    if loop.resume != "continue":
        return text + "; resume='close': it stays so"
    if loop._core.resumable:
        return text + "; a continuation answers it at the next wake()"
    return text + "; not continued again (too many crashes in a row)"


def _history_row(loop: Any) -> str:
    """What the next request's history holds, and what compaction replaced (nothing when the
    history was never compacted and no Compactor is set)."""
    spans = loop._core.history_spans()
    stood = [(lo, hi) for lo, hi in spans if lo != hi]
    if not stood and loop.compaction is None:
        return ""
    text = f"{len(spans)} messages"
    if stood:
        covered = sorted(set(stood))
        text += "; compacted: " + ", ".join(f"events {lo}–{hi}" for lo, hi in covered)
    if loop.compaction is not None:
        text += f" · {loop.compaction!r}"
    return f"<tr><th>history</th><td>{esc(text)}</td></tr>"


def mcp_server(server: Any) -> str:
    """A ``kerman.mcp.MCPServer``: transport, state, and the tools it offers once listed."""
    transport = "http" if server._target.__class__.__name__ == "HttpTarget" else "stdio"
    head = (
        f"MCPServer {_label('name', server.name)} {_label('transport', transport)} "
        f"{_label('state', 'running' if server.connected else 'stopped')} {_label('starts', server.starts)}"
    )
    listed = server._tools
    if listed is None:
        tools = '<span class="k-note">not listed yet (listed at the first model request)</span>'
    else:
        tools = ", ".join(f'<code>{esc(t.name)}</code> <span class="k-dim">{esc(t.effect)}</span>' for t in listed) or (
            '<span class="k-note">none</span>'
        )
    rows = f"<tr><th>tools</th><td>{tools}</td></tr>"
    if server.prefix:
        rows += f"<tr><th>prefix</th><td><code>{esc(server.prefix)}</code></td></tr>"
    if server.timeout is not None:
        rows += f"<tr><th>timeout</th><td>{esc(server.timeout)} s</td></tr>"
    return _box(head, f"<table>{rows}</table>")
