"""``kerman log in-doubt`` and ``kerman log resolve``: the tool calls in doubt of a store's
sessions, and an operator's one result for such a call (docs/durability.md#calls-in-doubt)."""

from __future__ import annotations

import argparse
import json
from typing import Any, List

from .. import FileStore
from .._doubt import unanswered
from ..errors import SessionLockedError
from ._common import STORE_HELP, _Exit, _is_dsn, _out, _postgres, _session_call, _shown_id, _store


def calls_in_doubt(events: List[Any]) -> List[dict[str, Any]]:
    """The calls of the last turn's open step with a ``tool/call`` and no ``tool/result``,
    in call order: ``{"call_id", "name", "seq", "effect", "policy"}``, with ``"decision_id"``,
    ``"asked"`` (the request's kind: ``in-doubt``, ``input``) and, once decided, ``"decided"``
    (its outcome) when a person was asked about it. Read from the records as stored (before a
    store's open closes a crashed turn, every call in doubt is listed, whatever its policy)."""
    calls = [{k: v for k, v in call.items() if k != "open"} for call in unanswered(events) if call["open"]]
    by_seq = {call["seq"]: call for call in calls}
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        if event.type == "decision/requested" and data.get("callSeq") in by_seq:
            call = by_seq[data["callSeq"]]
            call.update(decision_id=data.get("decisionId", ""), asked=data.get("kind", ""))
            call.pop("decided", None)
        elif event.type == "decision/resolved":
            for call in calls:
                if call.get("decision_id") == data.get("decisionId"):
                    call["decided"] = data.get("outcome", "")
    return calls


def add_parsers(log_commands: Any) -> None:
    """``in-doubt`` and ``resolve`` under ``kerman log``."""
    in_doubt = log_commands.add_parser(
        "in-doubt",
        help="list the tool calls in doubt (logged, no result) of each session's last turn",
        description="list the tool calls in doubt (logged, no result) of each session's last turn",
    )
    in_doubt.add_argument("store", help=STORE_HELP)
    in_doubt.add_argument("id", nargs="?", default=None, help="the session id (every session of the store when left out)")
    in_doubt.add_argument("--json", action="store_true", help="print a JSON list of {session, call_id, name, seq, effect, policy}")
    in_doubt.set_defaults(handler=_cmd_in_doubt)
    resolve = log_commands.add_parser(
        "resolve",
        help="record the one result of a tool call in doubt; nothing runs",
        description="Record TEXT as the one result of call CALL_ID in doubt in a session no process has open "
        "(FileStore.resolve / PostgresStore.resolve); nothing runs. A call not in doubt is refused.",
    )
    resolve.add_argument("store", help=STORE_HELP)
    resolve.add_argument("id", help="the session id")
    resolve.add_argument("call_id", metavar="CALL_ID", help="the call in doubt (see `kerman log in-doubt`)")
    resolve.add_argument("text", metavar="TEXT", help="the result the model gets for the call")
    resolve.add_argument("--error", action="store_true", help="record it as an error result (the call failed)")
    resolve.set_defaults(handler=_cmd_resolve)


def _sessions(args: argparse.Namespace) -> List[str]:
    if args.id is not None:
        return [args.id]
    if _is_dsn(args.store):
        # Only a session whose last turn has not ended can have a call in doubt left.
        return [row["id"] for row in _postgres(args.store).sessions() if row.get("last_ending") == "open"]
    return sorted(_store(args.store).list())


def _cmd_in_doubt(args: argparse.Namespace) -> int:
    from ._log import _read

    rows: list[dict[str, Any]] = []
    for session_id in _sessions(args):
        _, events, _ = _read(argparse.Namespace(**{**vars(args), "id": session_id}))
        rows.extend({"session": session_id, **call} for call in calls_in_doubt(events))
    if args.json:
        _out(json.dumps(rows, ensure_ascii=False, separators=(",", ":")))
        return 0
    if not rows:
        _out("no calls in doubt")
        return 0
    for row in rows:
        where = f"{_shown_id(row['session'])}  {row['call_id']}  {row['name']}  seq {row['seq']}"
        asked = ""
        if "decision_id" in row:
            asked = f"  {row['asked']} decision {row['decision_id']} {row.get('decided', 'pending')}"
        _out(f"{where}  {row['effect']}  on_in_doubt={row['policy']}{asked}")
    return 0


def _cmd_resolve(args: argparse.Namespace) -> int:
    # An operator's one write: a folder is opened synced (the reading commands open it with
    # durability="none").
    store = _postgres(args.store) if _is_dsn(args.store) else FileStore(_store(args.store).root, durability="strict")

    def resolve(sid: str) -> int:
        seq: int = store.resolve(sid, args.call_id, args.text, is_error=args.error)
        return seq

    try:
        seq = _session_call(resolve, args.id)
    except _Exit as refused:
        # ValueError here is the call, not the id: the store names it.
        raise _Exit(1, refused.message) from None
    except SessionLockedError as locked:
        raise _Exit(1, f"kerman: {locked}; a live owner resolves it with loop.resolve") from None
    kind = "an error result" if args.error else "a result"
    _out(f'resolved call {args.call_id} of session "{_shown_id(args.id)}": {kind} at seq {seq}; nothing ran')
    return 0
