"""Calls in doubt as a reader of the log finds them (``docs/durability.md#calls-in-doubt``), for
what shows them: ``kerman log show`` and ``kerman log in-doubt``, the notebook reprs, the
worker's takeover lines and ``kerman sessions --attention``.

Two marks: a ``tool/call`` (the write-ahead record) with no ``tool/result`` in its step — the
process died or lost its lease while the body ran, and nothing has settled it yet — and a
``tool/result`` with ``TOOL_OUTCOME_UNKNOWN`` — such a call failed by its policy (``fail``, or a
``reconcile`` that found nothing): its side effect may or may not have happened. Read from the
records as stored, with no registered tool and no fold of the loop's.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

OUTCOME_UNKNOWN = "TOOL_OUTCOME_UNKNOWN"

# What a resume does with a call in doubt the take left open, by policy.
_ON_RESUME = {
    "retry": "runs again with the same key",
    "reconcile": "its reconcile function gives the result",
    "ask": "a person decides",
}

# What ends the step a tool/call belongs to: a call still open then was never answered.
_STEP_BOUNDARIES = ("turn/start", "turn/end", "step/start", "step/end")


def _data(event: Any) -> Dict[str, Any]:
    data = event.data
    return data if isinstance(data, dict) else {}


def result_call_id(data: Dict[str, Any]) -> str:
    """The call a ``tool/result``'s payload answers."""
    message = data.get("message")
    source = message.get("source") if isinstance(message, dict) else None
    call_id = source.get("callId") if isinstance(source, dict) else None
    return call_id if isinstance(call_id, str) else ""


def call_info(event: Any) -> Dict[str, Any]:
    """``{"call_id", "name", "seq", "effect", "policy"}`` of a ``tool/call`` event (the defaults
    ``write`` and ``fail`` when the record leaves them out)."""
    data = _data(event)
    return {
        "call_id": str(data.get("callId", "")),
        "name": str(data.get("name", "")),
        "seq": event.seq,
        "effect": str(data.get("effect", "write")),
        "policy": str(data.get("onInDoubt", "fail")),
    }


def unanswered(events: Iterable[Any]) -> List[Dict[str, Any]]:
    """Every ``tool/call`` with no ``tool/result`` in its step, in log order (:func:`call_info`
    each, with ``"open"``: True when its step is the last one and has not ended, so a resume or
    an operator can still settle it)."""
    found: List[Dict[str, Any]] = []
    open_calls: Dict[str, Dict[str, Any]] = {}
    for event in events:
        kind = event.type
        if kind in _STEP_BOUNDARIES:
            found.extend({**c, "open": False} for c in open_calls.values())
            open_calls = {}
        elif kind == "tool/call":
            info = call_info(event)
            open_calls[info["call_id"]] = info
        elif kind == "tool/result":
            open_calls.pop(result_call_id(_data(event)), None)
    found.extend({**c, "open": True} for c in open_calls.values())
    found.sort(key=lambda c: c["seq"])
    return found


def outcome_unknown(events: Iterable[Any]) -> List[Dict[str, Any]]:
    """Every ``tool/result`` with ``TOOL_OUTCOME_UNKNOWN``: ``{"seq", "call_id", "call_seq"}``
    (``call_seq``: the ``tool/call`` it cites, or None)."""
    found = []
    for event in events:
        if event.type != "tool/result":
            continue
        data = _data(event)
        error = data.get("error")
        if isinstance(error, dict) and error.get("code") == OUTCOME_UNKNOWN:
            cited = event.source_event_seqs or []
            found.append({"seq": event.seq, "call_id": result_call_id(data), "call_seq": cited[0] if cited else None})
    return found


def marks(events: Iterable[Any]) -> Dict[int, str]:
    """seq -> what to say under that event: a call in doubt, or an outcome-unknown result."""
    events = list(events)
    out: Dict[int, str] = {}
    for call in unanswered(events):
        settle = "resolve it with `kerman log resolve`" if call["open"] else "its turn ended without it"
        out[call["seq"]] = (
            f"IN DOUBT: call #{call['call_id']} ({call['effect']}, on_in_doubt={call['policy']}) has no result: "
            f"it may or may not have run; {settle}"
        )
    for result in outcome_unknown(events):
        out[result["seq"]] = f"OUTCOME UNKNOWN: call #{result['call_id']} was in doubt and failed by its policy: it may have run"
    return out


def takeover(events: List[Any], closers: int, open_calls: List[Dict[str, Any]]) -> Optional[str]:
    """What a worker found when it took a session, in one line, or None when the last owner
    left nothing unfinished. ``events``: the log as taken (the crash closers, ``closers`` of
    them, are its last events); ``open_calls``: ``AgentLoop.in_doubt`` (calls a resume settles
    by their policy)."""
    closing = events[len(events) - closers :] if closers else []
    failed = {r["call_seq"]: r for r in outcome_unknown(closing)}
    calls = {e.seq: call_info(e) for e in events if e.type == "tool/call" and e.seq in failed}
    parts = []
    for seq, result in failed.items():
        call = calls.get(seq, {"call_id": result["call_id"], "name": "?", "effect": "?", "policy": "fail"})
        parts.append(f"call {call['call_id']} {call['name']} ({call['effect']}) in doubt: {call['policy']} -> closed as {OUTCOME_UNKNOWN}")
    for call in open_calls:
        policy = call["policy"]
        then = _ON_RESUME.get(policy, "settled by its policy")
        parts.append(f"call {call['call_id']} {call['name']} in doubt: {policy} -> {then}")
    if not closers and not parts:
        return None
    ends = [e for e in closing if e.type == "turn/end"]
    head = f"turn {_data(ends[-1]).get('turn')} was interrupted" if ends else "its last turn was left open"
    return head + ("; " + "; ".join(parts) if parts else "; no call was in doubt")
