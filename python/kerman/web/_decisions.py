"""The decision routes (docs/web.md, "Decisions"): the requests a session's waiting turn puts to
a person, and deciding one. A session this process owns is decided by its loop
(``loop.decide``); one a worker owns (a ``PostgresStore``) through the store
(``store.decide``), which the owner applies and answers."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Dict, List, Optional

from ..decisions import outcome_of, pending
from ..errors import DecisionError
from ..ui._base import JsonDict
from ._errors import ApiError
from ._sessions import REMOTE_TIMEOUT, Session, Sessions

FIELDS = ("outcome", "reason", "arguments", "value", "by", "key")
# Each outcome and the field it takes besides ``by`` and ``key``.
TAKES = {"approve": (), "deny": ("reason",), "edit": ("arguments",), "answer": ("value",)}
OUTCOMES = tuple(TAKES)
DETAILS = ("reason", "arguments", "value")

# Why a decision was refused (``DecisionError.reason``, or the owner's answer): status and code.
_REFUSED = {
    "unknown": (404, "decision-not-found"),
    "resolved": (409, "decision-resolved"),
    "expired": (409, "decision-expired"),
    "invalid": (422, "invalid-decision"),
    "timeout": (504, "owner-timeout"),
}


def listed(sessions: Sessions, session: Session) -> List[Dict[str, Any]]:
    """The pending requests, oldest first: the owner's ``loop.decisions``, or the same fold of
    the followed log."""
    requests = session.loop.decisions if session.loop is not None else pending(session.log)
    return [dataclasses.asdict(r) for r in requests]


def _optional_text(body: JsonDict, field: str) -> Optional[str]:
    value = body.get(field)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, "invalid-body", f"'{field}' must be a string, not {value!r}")
    return value


async def decide(sessions: Sessions, session: Session, decision_id: str, body: JsonDict) -> JsonDict:
    """Applies the decision ``body`` names to request ``decision_id``; the same ``key`` again is
    answered as a duplicate and changes nothing."""
    kind = body.get("outcome")
    if kind not in OUTCOMES:
        raise ApiError(422, "invalid-decision", f"'outcome' must be one of {', '.join(OUTCOMES)}, not {kind!r}")
    extra = [f for f in DETAILS if f in body and f not in TAKES[kind]]
    if extra:
        raise ApiError(422, "invalid-decision", f"a decision to {kind} takes no {', '.join(map(repr, extra))}")
    by, key = _optional_text(body, "by"), _optional_text(body, "key")
    try:
        outcome = outcome_of({"kind": kind, **{f: body[f] for f in DETAILS if f in body}})
    except ValueError as error:
        raise ApiError(422, "invalid-decision", str(error)) from None
    if session.loop is None:
        if not sessions.remote_ops:
            raise ApiError(409, "not-owner", f'cannot decide in session "{session.id}": {session.owner_note}')
        answer: JsonDict = await asyncio.to_thread(
            sessions.store.decide, session.id, decision_id, outcome, by=by, key=key, timeout=REMOTE_TIMEOUT
        )
        if not answer.get("applied"):
            raise _refused(session, str(answer.get("reason", "refused")), str(answer.get("detail", "")))
        duplicate = bool(answer.get("duplicate"))
    else:
        try:
            duplicate = not session.loop.decide(decision_id, outcome, by=by, key=key)
        except DecisionError as error:
            raise _refused(session, error.reason, str(error)) from None
        # Durable before it is answered, as store.decide's is: a decision nothing follows at once
        # (another framework's request, say) would otherwise wait for the next sync.
        await session.log.flush()
    return {"decision_id": decision_id, "outcome": kind, "duplicate": duplicate}


def _refused(session: Session, reason: str, detail: str) -> ApiError:
    status, code = _REFUSED.get(reason, (409, reason))
    return ApiError(status, code, f'session "{session.id}": {detail or f"decision refused ({reason})"}')
