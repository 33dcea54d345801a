"""``kerman log usage STORE [ID]``: what a session (or every session of a store) used and cost,
from its log (kerman.usage.ledger)."""

from __future__ import annotations

import argparse
import json
from typing import Any, List, Tuple

from ..errors import KermanError
from ._common import _err, _is_dsn, _out, _postgres, _shown, _shown_id, _store
from ._log import _read


def add_parser(log_commands: Any, store_help: str) -> None:
    sub = log_commands.add_parser(
        "usage",
        help="print what a session used and cost (per turn), or every session's totals",
        description="What a session's model requests used and cost, per turn and in total, folded from its log "
        "(docs/usage.md). Without ID: one line per session of the store.",
    )
    sub.add_argument("store", help=store_help)
    sub.add_argument("id", nargs="?", help="the session id (default: every session, one line each)")
    sub.add_argument("--json", action="store_true", help="print the ledger as JSON (session, turns, requests)")
    sub.add_argument("--model", help="the model that served requests whose model the log does not record (for prices)")
    sub.add_argument("--provider", help="its provider (genai-prices' id: openai, anthropic, google, ...)")
    sub.add_argument("--no-prices", action="store_true", help="do not price (every cost unknown)")
    sub.set_defaults(handler=_cmd_usage)


def _ledger(args: argparse.Namespace, events: Any) -> Any:
    from ..usage import ledger

    return ledger(events, pricer=None if args.no_prices else "default", model=args.model, provider=args.provider)


def _cost(totals: Any) -> str:
    if totals.cost is not None:
        return f"${totals.cost:.4f}"
    return f"≥${totals.known_cost:.4f}?" if totals.known_cost else "?"


COLUMNS = ("requests", "failed", "input", "cache read", "cache write", "output", "reasoning", "tool calls", "model s", "cost")


def _row(name: str, t: Any) -> List[str]:
    return [
        name,
        str(t.requests),
        str(t.failed),
        f"{t.input:,}",
        f"{t.cache_read:,}",
        f"{t.cache_write:,}",
        f"{t.output:,}",
        f"{t.reasoning:,}",
        str(t.tool_calls),
        f"{t.model_ms / 1000:.1f}",
        _cost(t),
    ]


def _table(first: str, rows: List[List[str]]) -> None:
    head = [first, *COLUMNS]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        _out("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True))).rstrip())


def _cmd_usage(args: argparse.Namespace) -> int:
    if args.id is None:
        return _every_session(args)
    _, events, _ = _read(args)
    book = _ledger(args, events)
    if args.json:
        _out(json.dumps(dict(id=args.id, **book.to_dict()), ensure_ascii=False, separators=(",", ":")))
        return 0
    _table("turn", [_row(str(turn), t) for turn, t in book.turns.items()] + [_row("session", book.session)])
    if book.session.cost is None:
        _err(f"kerman: {book.session.unpriced} request(s) without a known price (model unknown to the pricer, or no usage reported)")
    return 0


def _every_session(args: argparse.Namespace) -> int:
    from ._common import _follow

    ids: List[str]
    if _is_dsn(args.store):
        store: Any = _postgres(args.store)
        ids = sorted(store.list())
    else:
        store = _store(args.store)
        ids = sorted(store.list())
    books: List[Tuple[str, Any]] = []
    for session_id in ids:
        try:
            if _is_dsn(args.store):
                events = _follow(store, session_id)[1]
            else:
                events = store._read(session_id, False)[1]
        except KermanError as e:
            _err(f"kerman: {_shown_id(session_id)}: skipped ({e})")
            continue
        books.append((session_id, _ledger(args, events)))
    if args.json:
        _out(json.dumps([dict(id=i, **b.session.to_dict()) for i, b in books], ensure_ascii=False, separators=(",", ":")))
        return 0
    if not books:
        _err(f"kerman: no sessions in {_shown(args.store)}")
        return 0
    total = sum((b.session for _, b in books[1:]), books[0][1].session)
    _table("session", [_row(_shown_id(i), b.session) for i, b in books] + [_row("total", total)])
    return 0
