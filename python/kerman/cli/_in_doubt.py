"""``kerman log in-doubt STORE [ID]``: the tool calls in doubt (their ``tool/call`` is logged,
their ``tool/result`` is not) of the last turn of each session (docs/durability.md)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Dict, List

from ._common import _err, _is_dsn, _out, _shown_id, _store
from ._log import _read


def calls_in_doubt(events: List[Any]) -> List[Dict[str, Any]]:
    """The calls of the last turn's open step with a ``tool/call`` and no ``tool/result``,
    in call order: ``{"call_id", "name", "seq", "effect", "policy"}``. Read from the records as
    stored (before a store's open closes a crashed turn, every call in doubt is listed, whatever
    its policy)."""
    open_calls: Dict[str, Dict[str, Any]] = {}
    for event in events:
        kind, data = event.type, event.data if isinstance(event.data, dict) else {}
        if kind in ("turn/start", "turn/end", "step/start", "step/end"):
            open_calls = {}
        elif kind == "tool/call":
            call_id = data.get("callId", "")
            open_calls[call_id] = {
                "call_id": call_id,
                "name": data.get("name", ""),
                "seq": event.seq,
                "effect": data.get("effect", "write"),
                "policy": data.get("onInDoubt", "fail"),
            }
        elif kind == "tool/result":
            source = (data.get("message") or {}).get("source") or {}
            open_calls.pop(source.get("callId", ""), None)
    return list(open_calls.values())


def _cmd_in_doubt(args: argparse.Namespace) -> int:
    if args.id is None:
        if _is_dsn(args.store):
            _err("kerman: give a session id for a PostgreSQL store")
            return 2
        ids = sorted(_store(args.store).list())
    else:
        ids = [args.id]
    rows = []
    for session_id in ids:
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
        _out(f"{where}  {row['effect']}  on_in_doubt={row['policy']}")
    return 0
