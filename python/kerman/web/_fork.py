"""Edit an earlier message and continue from there (``POST /sessions/{id}/fork``): the
session is forked just before the message was taken from the queue, the queue at the cut is
dropped (it still holds the original message), and the edited text is sent to the fork as a
followup. The original session is unchanged (docs/context.md, "Edit an earlier message")."""

from __future__ import annotations

from typing import Any

from .._core import SessionLog
from ._errors import ApiError


def cut_before(log: SessionLog, session_id: str, message_id: str) -> int:
    """The seq to fork at so that the fork ends just before user message ``message_id`` was
    claimed: before its turn's ``turn/start`` for a prompt that opened a turn, else before the
    claim (steering, entered at a later step; the fork then ends inside that turn, which its
    crash closers close when it is opened)."""
    entered = None
    for event in log.events():
        if event.type == "user/message" and _id(event.data) == message_id:
            entered = event
            break
    if entered is None:
        raise ApiError(404, "message-not-found", f'no user message "{message_id}" in session "{session_id}"')
    if any(block.get("type") != "text" for block in entered.data.get("content", [])):
        raise ApiError(409, "not-text", f'message "{message_id}" holds more than text; only text messages can be edited')
    before = list(log.events(0, entered.seq))
    claims = [e for e in before if e.type == "agent/inbox/spliced"]
    if not claims:  # not claimed through the inbox (written by hand): fork just before it
        return entered.seq - 1
    claim = claims[-1].seq
    opened = [e for e in before if e.seq == claim - 1 and e.type == "turn/start"]
    cut = claim - 2 if opened else claim - 1
    if cut < 0:
        raise ApiError(409, "nothing-before", f'message "{message_id}" is where session "{session_id}" begins: there is nothing to fork')
    return cut


def _id(data: Any) -> Any:
    return data.get("id") if isinstance(data, dict) else None
