"""One-line human summaries of session log events, for timelines (``kerman log show``, the demo).

:func:`summarize` describes one event's payload; :func:`format_event` builds a whole timeline line
(seq, time, type, summary). Both accept an :class:`kerman.Event`, its wire dict or its
``kerman.events`` view, read the payload through the view, never raise on odd data (a payload
its view cannot read shows as compact JSON), and escape control characters so a log cannot drive
the terminal.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TypeVar

from .. import events

__all__ = ["summarize", "format_event", "message_text", "quote", "compact_json", "short_id", "source_tag", "TYPE_WIDTH"]

TYPE_WIDTH = 19  # len("agent/inbox/spliced"), the longest core type
TEXT_LIMIT = 60
JSON_LIMIT = 80


# Unicode bidi controls (embeddings, overrides, isolates, marks): printed raw they reorder what
# a terminal shows after them, so a log could make one text look like another.
_V = TypeVar("_V")

BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape(text: str, lines: bool = False) -> str:
    """Control characters (C0, DEL, C1), bidi controls, line separators and lone surrogates
    rendered as escapes (``\\x1b``, ``\\u202e``); everything else kept. ``lines=True`` keeps
    newlines and tabs (text shown as it was written, across lines)."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        code = ord(ch)
        if ch == "\n":
            out.append(ch if lines else "\\n")
        elif ch == "\t":
            out.append(ch if lines else "\\t")
        elif ch == "\r":
            out.append("\\r")
        elif code < 0x20 or 0x7F <= code < 0xA0:
            out.append(f"\\x{code:02x}")
        elif ch in "\u2028\u2029" or ch in BIDI_CONTROLS or (0xD800 <= code < 0xE000):
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def terminal_text(text: str) -> str:
    """``text`` safe to print on a terminal as lines: what :func:`_escape` escapes but newlines
    and tabs (``kerman chat`` prints every string through this)."""
    return _escape(text, lines=True)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def quote(text: object, limit: Optional[int] = TEXT_LIMIT) -> str:
    """``"text"`` truncated to ``limit`` characters (``None``: no limit), control characters escaped."""
    if not isinstance(text, str):
        text = str(text)
    if limit is not None:
        text = _truncate(text, limit)
    return '"' + _escape(text) + '"'


def compact_json(value: object, limit: Optional[int] = JSON_LIMIT) -> str:
    """Compact JSON (non-JSON values rendered with ``repr``), truncated, control characters escaped."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    if limit is not None:
        text = _truncate(text, limit)
    return _escape(text)


def short_id(message_id: object) -> str:
    """A message id shortened for a timeline.

    Minted ids are UUIDv7, whose leading characters are a timestamp shared by every message of a
    session, so the distinguishing end is kept: ``…f87f2b``.
    """
    text = _escape(str(message_id))
    return text if len(text) <= 12 else "…" + text[-6:]


def _blocks_text(blocks: Iterable[events.Block]) -> str:
    parts = []
    for block in blocks:
        if isinstance(block, events.TextBlock):
            parts.append(block.text)
        elif isinstance(block, events.ToolResultBlock):
            inner = block.content
            parts.append(_blocks_text(inner) if inner else block.text)
        elif block.type == "image":
            parts.append("[image]")
    return "\n".join(p for p in parts if p)


def _view_text(message: events.MessageView) -> str:
    blocks = message.content
    return _blocks_text(blocks) if blocks else message.text


def message_text(message: object) -> str:
    """The text of a message (a ``Message``, its dict or its view): its text blocks and its
    tool result's, ``[image]`` for an image, joined with newlines."""
    if isinstance(message, events.MessageView):
        return _view_text(message)
    if isinstance(message, Mapping):
        return _view_text(events.MessageView(message))
    text = getattr(message, "text", None)
    return text if isinstance(text, str) else ""


def source_tag(source: object) -> str:
    """`` [kind]`` (``[plugin:name]`` for plugins) unless the source is the user."""
    if isinstance(source, Mapping):
        source = events.Source(source)
    if not isinstance(source, events.Source):
        return ""
    kind, plugin = source.kind, source.plugin
    if kind in (None, "user"):
        return ""
    tag = f"{kind}:{plugin}" if plugin else str(kind)
    return f" [{_escape(tag)}]"


class _Odd(Exception):
    """A payload its view cannot read (a field Kerman always writes is absent or of another
    JSON type): the summary shows the payload as stored."""


def _need(value: Optional[_V]) -> _V:
    """``value`` unless it is the default a view reads for an absent or odd field (turns and
    steps count from 1; ids, names and kinds are never empty)."""
    if not value:
        raise _Odd
    return value


def _turn_step(v: events.StepStart | events.StepEnd) -> str:
    return f"turn {_need(v.turn)} step {_need(v.step)}"


def _splice(v: events.InboxSpliced) -> str:
    target = _escape(_need(v.target))
    removed = v.removed_count
    inserted = v.inserted
    outcome = v.outcome
    items = ", ".join(f"{quote(_view_text(m))} ({short_id(m.id)})" for m in inserted)
    at = f" at {v.start}" if v.start else ""
    if removed and inserted:
        text = f"replace {target}{at} ×{removed} → {items}"
    elif removed:
        text = f"-{target}{at} ×{removed}" if outcome is not None else f"claim {target} ×{removed}"
    else:
        text = f"+{target}{at} {items}" if inserted else f"{target} (no change)"
    if outcome is not None:
        text += f" {_escape(outcome)}"
    by = v.by
    if by is not None and removed and outcome is None:
        text += " by " + _escape(json.dumps(by, ensure_ascii=False, separators=(",", ":")))
    return text


def _turn_end(v: events.TurnEnd) -> str:
    reason = v.reason
    head = f"turn {_need(v.turn)}"
    kind = _need(reason.kind)
    if kind == "completed":
        return f"{head} completed"
    if kind == "aborted":
        cause = reason.cause
        if cause is not None and cause.kind is not None:
            detail = cause.kind
            if cause.reason is not None:
                detail += f": {cause.reason}"
        else:
            raise _Odd
        if reason.rolled_back:  # its messages left the history: say so where it ends
            return f"{head} rolled back: aborted ({_escape(_truncate(detail, TEXT_LIMIT))}), out of the history from here"
        return f"{head} aborted ({_escape(_truncate(detail, TEXT_LIMIT))})"
    if kind == "blocked":
        why = reason.blocked_reason
        return f"{head} blocked" + (f": {_escape(_truncate(why, TEXT_LIMIT))}" if why is not None else "")
    if kind == "budget":
        stop = reason.budget
        return f"{head} budget" + (f": {_escape(stop.text())}" if stop is not None and stop.limit is not None else "")
    if kind == "error":
        error = reason.error
        if error is not None:
            message = _escape(_truncate(error.message, TEXT_LIMIT))
            text = f"{head} error: {message} [{_escape(error.code or 'UNKNOWN')}]"
            return text + _raised_in(error)
        raise _Odd
    extra = {k: val for k, val in reason.raw.items() if k != "kind"}
    return f"{head} {_escape(kind)}" + (f" {compact_json(extra)}" if extra else "")


def _raised_in(error: events.Failure) -> str:
    """`` NameError in model`` for a failure recorded from a user exception."""
    kind, function = error.exception_type, error.function
    if kind is None:
        return ""
    return f" {_escape(kind)}" + (f" in {_escape(function)}" if function is not None else "")


def traceback_lines(event: object) -> List[str]:
    """The traceback text a ``turn/end`` failure or a ``tool/result`` error recorded, one
    escaped line each (none for other events). Never raises."""
    try:
        v = _view(event)
        if isinstance(v, events.TurnEnd):
            error = v.reason.error
        elif isinstance(v, events.ToolResultEvent):
            error = v.error
        else:
            return []
        text = error.traceback if error is not None else None
        return [_escape(line) for line in text.rstrip("\n").split("\n")] if text is not None else []
    except Exception:
        return []


def _user_message(v: events.UserMessageEvent) -> str:
    return quote(_view_text(v.message)) + source_tag(v.message.source)


def _call(name: str, arguments: object) -> str:
    if not isinstance(arguments, str):
        arguments = compact_json(arguments, None)
    return f"{_escape(name)}({_escape(_truncate(arguments, 40))})"


def _assistant_message(v: events.AssistantMessageEvent) -> str:
    message = v.message
    if not message.raw:
        raise _Odd
    parts = []
    text = _view_text(message)
    if text:
        parts.append(quote(text))
    for call in message.tool_calls:
        parts.append("→ " + _call(call.name, call.arguments))
    if v.interrupted:
        parts.append("(interrupted)")
    return " ".join(parts) if parts else "(empty)"


def _chunk(v: events.AssistantChunk) -> str:
    chunk = v.chunk
    kind = _escape(_need(chunk.type))
    text = chunk.get("text")  # any chunk type's text, a plugin's too
    if isinstance(text, str):
        return f"{kind} {quote(text)}"
    if isinstance(chunk, events.ToolCallChunk):
        return f"{kind} " + _call(chunk.name, chunk.arguments)
    if isinstance(chunk, events.FinishChunk):
        text = f"{kind} {_escape(str(chunk.reason))}"
        error = chunk.error
        if error is not None:
            text += f": {_escape(_truncate(error.message, TEXT_LIMIT))} [{_escape(error.code or 'UNKNOWN')}]"
        model = chunk.model
        if model is not None:  # the model a Fallback tried
            text += f" ({_escape(model)})"
        return text
    rest = {k: val for k, val in chunk.raw.items() if k != "type"}
    return f"{kind} {compact_json(rest)}" if rest else kind


def _tool_call(v: events.ToolCall) -> str:
    return _call(_need(v.name), v.arguments) + f" #{_escape(_need(v.call_id))}"


def _tool_result(v: events.ToolResultEvent) -> str:
    message = v.message
    call_id = message.source.call_id
    if not message.raw:
        raise _Odd
    text = quote(_view_text(message))
    if call_id is not None:
        text = f"#{_escape(call_id)} {text}"
    error = v.error
    if error is not None:
        text += f" error {_escape(error.code or 'UNKNOWN')}" + _raised_in(error)
    return text


def _request_header(v: events.RequestHeader) -> str:
    """``request/header {options}`` (SPEC 4.7): the final request options."""
    options = v.options
    return "options " + compact_json(options) if options else "(no options)"


def _seqs(pair: Sequence[int]) -> str:
    first, last = pair
    return f"seq {first}" if first == last else f"seqs {first}–{last}"


def _damaged(v: events.LogDamaged) -> str:
    """A placeholder repair wrote at a lost seq (docs/format.md, "Repairing corruption")."""
    lines = v.lines
    where = f"lines {lines[0]}–{lines[1]}" if lines and lines[0] != lines[1] else (f"line {lines[0]}" if lines else "no line")
    return f"lost ({_seqs(v.seqs)}; {where} of {_escape(str(v.backup))})"


def _repaired(v: events.LogRepaired) -> str:
    lost = ", ".join(_seqs(pair) for pair in v.lost_seqs) or "no seq"
    dropped = len(v.dropped)
    return f"{dropped} line{'' if dropped == 1 else 's'} set aside, {lost} lost; backup {_escape(str(v.backup))}"


def _decision_requested(v: events.DecisionRequested) -> str:
    """``decision/requested``: the call waiting for a person, and what is asked (a budget's
    request is about no call: the numbers that stopped the request)."""
    if v.kind == "budget":
        return f"budget? {_escape(v.arguments)} [{_escape(_need(v.decision_id))}]" + ("" if v.note is None else " " + quote(v.note))
    text = f"{_escape(v.kind or 'approval')}? " + _call(_need(v.name), v.arguments)
    text += f" #{_escape(_need(v.call_id))} [{_escape(_need(v.decision_id))}]"
    if v.note is not None:
        text += " " + quote(v.note)
    if v.call_seq is not None:  # about a call that started: what the person may choose
        text += f" (call at seq {v.call_seq}; " + ", ".join(_escape(o) for o in v.options) + ")"
    if v.gated:  # the gate's verdicts on the step's other calls, which the step resumes with
        text += "; gated " + ", ".join(f"#{_escape(str(g.get('callId', '?')))} {_escape(str(g.get('verdict', '?')))}" for g in v.gated)
    return text


def _decision_resolved(v: events.DecisionResolved) -> str:
    """``decision/resolved``: the outcome, who decided, and what runs."""
    text = f"{_escape(_need(v.outcome))} #{_escape(_need(v.call_id))} [{_escape(_need(v.decision_id))}]"
    if v.by is not None:
        text += f" by {_escape(v.by)}"
    if v.arguments is not None:
        text += " → " + _escape(_truncate(v.arguments, TEXT_LIMIT))
    if v.reason is not None:
        text += " " + quote(v.reason)
    if isinstance(v.data, Mapping) and "value" in v.data:
        text += " " + compact_json(v.value)
    return text


def _output_validated(v: events.OutputValidated) -> str:
    """``output/validated``: the turn's structured output, as JSON."""
    return f"turn {_need(v.turn)} step {_need(v.step)} " + compact_json(v.output)


def _number(n: float) -> str:
    return str(int(n)) if float(n).is_integer() else f"{n:g}"


def _tool_progress(v: events.ToolProgress) -> str:
    """``tool/progress``: the call, how far (of what total, as a percentage) and its message."""
    text = f"#{_escape(_need(v.call_id))} {_number(v.progress)}"
    if v.total is not None:
        text += f"/{_number(v.total)}"
        if v.fraction is not None:
            text += f" ({v.fraction:.0%})"
    if v.message is not None:
        text += " " + quote(v.message)
    if v.task is not None:
        text += f" task {_escape(v.task)}"
    return text


def _compacted(v: events.ContextCompacted) -> str:
    """``context/compacted``: the span it replaced, how, and by what."""
    pinned = f", {len(v.pinned)} pinned" if v.pinned else ""
    text = f"events {_seqs((v.first, v.last))} {_escape(v.strategy or '?')} ({_escape(v.reason or '?')}{pinned})"
    replacement = v.messages
    if replacement is None:
        return text + " → reverted to the raw events"
    words = [b.text for m in replacement for b in m.content if isinstance(b, events.TextBlock)]
    text += f" → {len(replacement)} message{'' if len(replacement) == 1 else 's'}"
    if words:
        text += " " + quote(" ".join(words))
    if v.model is not None:
        text += f" by {_escape(v.model)}"
    return text


_SUMMARIES: Dict[type[events.EventView], Callable[[Any], str]] = {
    events.ContextCompacted: _compacted,
    events.DecisionRequested: _decision_requested,
    events.DecisionResolved: _decision_resolved,
    events.OutputValidated: _output_validated,
    events.ToolProgress: _tool_progress,
    events.LogDamaged: _damaged,
    events.LogRepaired: _repaired,
    events.InboxSpliced: _splice,
    events.TurnStart: lambda v: f"turn {_need(v.turn)}" + (f" continues turn {v.continues}" if v.continues is not None else ""),
    events.TurnEnd: _turn_end,
    events.StepStart: _turn_step,
    events.StepEnd: _turn_step,
    events.UserMessageEvent: _user_message,
    events.AssistantMessageEvent: _assistant_message,
    events.AssistantChunk: _chunk,
    events.ToolCall: _tool_call,
    events.ToolResultEvent: _tool_result,
    events.RequestHeader: _request_header,
}


def _parts(event: object) -> tuple[Any, Any, Any, Any]:
    """``(seq, time, type, data)`` of an Event or an event dict (the envelope, as stored)."""
    if isinstance(event, Mapping):
        return event.get("seq"), event.get("time"), event.get("type"), event.get("data")
    return (getattr(event, "seq", None), getattr(event, "time", None), getattr(event, "type", None), getattr(event, "data", None))


def _view(event: object) -> events.EventView:
    return event if isinstance(event, events.EventView) else events.view(event)  # type: ignore[arg-type]


def summarize(event: object) -> str:
    """A one-line human summary of an event's payload (an ``Event``, its dict or its view).
    Never raises."""
    try:
        v = _view(event)
    except Exception:  # not an event: show what it holds
        try:
            return compact_json(_parts(event)[3])
        except Exception:  # a hostile object: still a line
            return "<unreadable event>"
    handler = _SUMMARIES.get(type(v))
    if handler is not None and isinstance(v.data, dict):
        try:
            return handler(v)
        except Exception:  # odd data in a known type: show it raw
            pass
    elif handler is None and isinstance(v.data, dict):
        plugin = _plugin_summary(event, v.data)
        if plugin is not None:
            return plugin
    return compact_json(v.data)


def _plugin_summary(event: object, data: Dict[str, Any]) -> Optional[str]:
    """A plugin type's registered summary (``kerman.timeline``), escaped; ``None`` without one
    or when it raises."""
    from .. import timeline

    try:
        fn = timeline.summarizer(str(_parts(event)[2]))
        if fn is None:
            return None
        text = fn(data)
        return _escape(text) if isinstance(text, str) else None
    except Exception:  # a plugin's bug: the payload as it is
        return None


def _clock(time_ms: Any, t0: Any) -> str:
    try:
        if t0 is not None:
            return f"{(time_ms - t0) / 1000:+.3f}s".rjust(12)
        stamp = datetime.datetime.fromtimestamp(time_ms / 1000)
        return stamp.strftime("%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}"
    except Exception:  # absent, not a number, or out of range
        return "?".rjust(12)


def format_event(event: object, *, t0: Optional[int] = None) -> str:
    """One timeline line: seq (right-aligned), time, type (padded), summary.

    Time is local ``HH:MM:SS.mmm``, or seconds relative to ``t0`` (epoch ms) when given.
    """
    try:
        seq, time_ms, kind, _ = _parts(event)
    except Exception:
        seq = time_ms = kind = None
    seq_text = _escape(str(seq)).rjust(5)
    kind_text = _escape(str(kind)).ljust(TYPE_WIDTH)
    return f"{seq_text}  {_clock(time_ms, t0)}  {kind_text}  {summarize(event)}"
