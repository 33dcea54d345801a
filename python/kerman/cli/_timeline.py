"""One-line human summaries of session log events, for timelines (``kerman log show``, the demo).

:func:`summarize` describes one event's payload; :func:`format_event` builds a whole timeline line
(seq, time, type, summary). Both accept an :class:`kerman.Event` or its wire dict, never raise on odd
data (they fall back to compact JSON), and escape control characters so a log cannot drive the
terminal.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Callable, List, Mapping, Optional, Sequence

__all__ = ["summarize", "format_event", "message_text", "quote", "compact_json", "short_id", "source_tag",
           "TYPE_WIDTH"]

TYPE_WIDTH = 19  # len("agent/inbox/spliced"), the longest core type
TEXT_LIMIT = 60
JSON_LIMIT = 80


# Unicode bidi controls (embeddings, overrides, isolates, marks): printed raw they reorder what
# a terminal shows after them, so a log could make one text look like another.
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


def _blocks_text(content: object) -> str:
    if isinstance(content, str):
        return content
    parts = []
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, Mapping):
                continue
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif kind == "tool-result":
                parts.append(_blocks_text(block.get("content")))
            elif kind == "image":
                parts.append("[image]")
    return "\n".join(p for p in parts if p)


def message_text(message: object) -> str:
    """The text blocks of a message (a ``Message`` or its dict) joined with newlines."""
    if isinstance(message, Mapping):
        return _blocks_text(message.get("content"))
    text = getattr(message, "text", None)
    return text if isinstance(text, str) else ""


def source_tag(source: object) -> str:
    """`` [kind]`` (``[plugin:name]`` for plugins) unless the source is the user."""
    if not isinstance(source, Mapping):
        return ""
    kind = source.get("kind")
    if kind in (None, "user"):
        return ""
    plugin = source.get("plugin")
    tag = f"{kind}:{plugin}" if isinstance(plugin, str) and plugin else str(kind)
    return f" [{_escape(tag)}]"


def _turn_step(data: Mapping[str, Any]) -> str:
    text = f"turn {data.get('turn')}"
    if "step" in data:
        text += f" step {data.get('step')}"
    return text


def _splice(data: Mapping[str, Any]) -> str:
    target = _escape(str(data.get("target")))
    removed = data.get("removedCount", 0) or 0
    inserted = data.get("inserted") or []
    if not isinstance(inserted, list):
        raise TypeError("inserted is not a list")
    start = data.get("start", 0)
    outcome = data.get("outcome")
    items = ", ".join(
        f"{quote(message_text(m))} ({short_id(m.get('id'))})" if isinstance(m, Mapping) else compact_json(m)
        for m in inserted
    )
    at = f" at {start}" if start else ""
    if removed and inserted:
        text = f"replace {target}{at} ×{removed} → {items}"
    elif removed:
        text = f"-{target}{at} ×{removed}" if outcome is not None else f"claim {target} ×{removed}"
    else:
        text = f"+{target}{at} {items}" if inserted else f"{target} (no change)"
    if outcome is not None:
        text += f" {_escape(str(outcome))}"
    return text


def _turn_end(data: Mapping[str, Any]) -> str:
    reason = data.get("reason")
    head = f"turn {data.get('turn')}"
    if not isinstance(reason, Mapping):
        return f"{head} {compact_json(reason)}"
    kind = reason.get("kind")
    if kind == "completed":
        return f"{head} completed"
    if kind == "aborted":
        cause = reason.get("reason")
        if isinstance(cause, Mapping) and isinstance(cause.get("kind"), str):
            detail = cause["kind"]
            if cause.get("reason") is not None:
                detail += f": {cause['reason']}"
        else:
            detail = compact_json(cause, 40)
        return f"{head} aborted ({_escape(_truncate(str(detail), TEXT_LIMIT))})"
    if kind == "blocked":
        why = reason.get("reason")
        return f"{head} blocked" + (f": {_escape(_truncate(str(why), TEXT_LIMIT))}" if why is not None else "")
    if kind == "error":
        error = reason.get("error")
        if isinstance(error, Mapping):
            message = _escape(_truncate(str(error.get("message", "")), TEXT_LIMIT))
            text = f"{head} error: {message} [{_escape(str(error.get('code', 'UNKNOWN')))}]"
            return text + _raised_in(error)
        return f"{head} error: {compact_json(error)}"
    if isinstance(kind, str):
        extra = {k: v for k, v in reason.items() if k != "kind"}
        return f"{head} {_escape(kind)}" + (f" {compact_json(extra)}" if extra else "")
    return f"{head} {compact_json(reason)}"


def _raised_in(error: Mapping[str, Any]) -> str:
    """`` NameError in model`` for a failure recorded from a user exception."""
    kind, function = error.get("exceptionType"), error.get("function")
    if not isinstance(kind, str):
        return ""
    return f" {_escape(kind)}" + (f" in {_escape(str(function))}" if function is not None else "")


def traceback_lines(event: object) -> List[str]:
    """The traceback text a ``turn/end`` failure or a ``tool/result`` error recorded, one
    escaped line each (none for other events). Never raises."""
    try:
        _, _, kind, data = _parts(event)
        if kind == "turn/end":
            reason = data.get("reason")
            error = reason.get("error") if isinstance(reason, Mapping) else None
        elif kind == "tool/result":
            error = data.get("error")
        else:
            return []
        text = error.get("traceback") if isinstance(error, Mapping) else None
        return [_escape(line) for line in text.rstrip("\n").split("\n")] if isinstance(text, str) else []
    except Exception:
        return []


def _user_message(data: Mapping[str, Any]) -> str:
    return quote(message_text(data)) + source_tag(data.get("source"))


def _call(name: object, arguments: object) -> str:
    if not isinstance(arguments, str):
        arguments = compact_json(arguments, None)
    return f"{_escape(str(name))}({_escape(_truncate(arguments, 40))})"


def _assistant_message(data: Mapping[str, Any]) -> str:
    message = data.get("message")
    parts = []
    if isinstance(message, Mapping):
        text = message_text(message)
        if text:
            parts.append(quote(text))
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, Mapping) and block.get("type") == "tool-call":
                parts.append("→ " + _call(block.get("name"), block.get("arguments", "")))
    else:
        parts.append(compact_json(message))
    if data.get("interrupted"):
        parts.append("(interrupted)")
    return " ".join(parts) if parts else "(empty)"


def _chunk(data: Mapping[str, Any]) -> str:
    chunk = data.get("chunk")
    if not isinstance(chunk, Mapping):
        return compact_json(chunk)
    kind = _escape(str(chunk.get("type")))
    if isinstance(chunk.get("text"), str):
        return f"{kind} {quote(chunk['text'])}"
    if chunk.get("type") == "tool-call":
        return f"{kind} " + _call(chunk.get("name"), chunk.get("arguments", ""))
    if chunk.get("type") == "finish":
        text = f"{kind} {_escape(str(chunk.get('reason')))}"
        error = chunk.get("error")
        if isinstance(error, Mapping):
            text += f": {_escape(_truncate(str(error.get('message', '')), TEXT_LIMIT))} [{_escape(str(error.get('code', 'UNKNOWN')))}]"
        return text
    rest = {k: v for k, v in chunk.items() if k != "type"}
    return f"{kind} {compact_json(rest)}" if rest else kind


def _tool_call(data: Mapping[str, Any]) -> str:
    return _call(data.get("name"), data.get("arguments", "")) + f" #{_escape(str(data.get('callId')))}"


def _tool_result(data: Mapping[str, Any]) -> str:
    message = data.get("message")
    call_id = None
    if isinstance(message, Mapping):
        source = message.get("source")
        if isinstance(source, Mapping):
            call_id = source.get("callId")
    text = quote(message_text(message)) if isinstance(message, Mapping) else compact_json(message)
    if call_id is not None:
        text = f"#{_escape(str(call_id))} {text}"
    error = data.get("error")
    if isinstance(error, Mapping):
        text += f" error {_escape(str(error.get('code', 'UNKNOWN')))}" + _raised_in(error)
    elif error is not None:
        text += f" error {compact_json(error, 40)}"
    return text


def _request_header(data: Mapping[str, Any]) -> str:
    """``request/header {options}`` (SPEC 4.7): the final request options."""
    options = data.get("options")
    if isinstance(options, Mapping):
        return "options " + compact_json(options) if options else "(no options)"
    return compact_json(data)


def _seqs(pair: Sequence[int]) -> str:
    first, last = pair
    return f"seq {first}" if first == last else f"seqs {first}–{last}"


def _damaged(d: Mapping[str, Any]) -> str:
    """A placeholder repair wrote at a lost seq (docs/format.md, "Repairing corruption")."""
    lines = d.get("lines")
    where = f"lines {lines[0]}–{lines[1]}" if lines and lines[0] != lines[1] else (
        f"line {lines[0]}" if lines else "no line")
    return f"lost ({_seqs(d['seqs'])}; {where} of {_escape(str(d.get('backup')))})"


def _repaired(d: Mapping[str, Any]) -> str:
    lost = ", ".join(_seqs(pair) for pair in d.get("lostSeqs") or ()) or "no seq"
    dropped = len(d.get("dropped") or ())
    return f"{dropped} line{'' if dropped == 1 else 's'} set aside, {lost} lost; backup {_escape(str(d.get('backup')))}"


def _decision_requested(data: Mapping[str, Any]) -> str:
    """``decision/requested``: the call waiting for a person, and what is asked."""
    text = f"{_escape(str(data.get('kind', 'approval')))}? " + _call(data.get("name"), data.get("arguments", ""))
    text += f" #{_escape(str(data.get('callId')))} [{_escape(str(data.get('decisionId')))}]"
    if isinstance(data.get("note"), str):
        text += " " + quote(data["note"])
    return text


def _decision_resolved(data: Mapping[str, Any]) -> str:
    """``decision/resolved``: the outcome, who decided, and what runs."""
    text = f"{_escape(str(data.get('outcome')))} #{_escape(str(data.get('callId')))} [{_escape(str(data.get('decisionId')))}]"
    if isinstance(data.get("by"), str):
        text += f" by {_escape(data['by'])}"
    if isinstance(data.get("arguments"), str):
        text += " → " + _escape(_truncate(data["arguments"], TEXT_LIMIT))
    if isinstance(data.get("reason"), str):
        text += " " + quote(data["reason"])
    if "value" in data:
        text += " " + compact_json(data["value"])
    return text


_SUMMARIES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "decision/requested": _decision_requested,
    "decision/resolved": _decision_resolved,
    "log/damaged": _damaged,
    "log/repaired": _repaired,
    "agent/inbox/spliced": _splice,
    "turn/start": lambda d: f"turn {d.get('turn')}",
    "turn/end": _turn_end,
    "step/start": _turn_step,
    "step/end": _turn_step,
    "user/message": _user_message,
    "assistant/message": _assistant_message,
    "assistant/chunk": _chunk,
    "tool/call": _tool_call,
    "tool/result": _tool_result,
    "request/header": _request_header,
}


def _parts(event: object) -> tuple[Any, Any, Any, Any]:
    """``(seq, time, type, data)`` of an Event or an event dict."""
    if isinstance(event, Mapping):
        return event.get("seq"), event.get("time"), event.get("type"), event.get("data")
    return (getattr(event, "seq", None), getattr(event, "time", None), getattr(event, "type", None),
            getattr(event, "data", None))


def summarize(event: object) -> str:
    """A one-line human summary of an event's payload. Never raises."""
    try:
        _, _, kind, data = _parts(event)
    except Exception:  # a hostile object: still a line
        return "<unreadable event>"
    handler = _SUMMARIES.get(kind) if isinstance(kind, str) else None
    if handler is not None and isinstance(data, Mapping):
        try:
            return handler(data)
        except Exception:  # odd data in a known type: show it raw
            pass
    return compact_json(data)


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
