"""``GET /sessions/{id}/usage``: the session's usage ledger (docs/usage.md) as the web chat shows
it, one line per turn under its reply and the session's total in the header."""

from __future__ import annotations

from typing import Any, Dict

from ..usage import Totals, ledger

__all__ = ["usage_of"]


def _totals(totals: Totals) -> Dict[str, Any]:
    return dict(totals.to_dict(), tokens=totals.tokens, summary=totals.summary())


def usage_of(source: Any) -> Dict[str, Any]:
    """``{"session": totals, "turns": [{"turn": n, ...totals}]}``, each with its ``tokens`` and a
    one-line ``summary``. ``source`` is the session's loop when this process owns it (its model
    names what prices the requests), else its log."""
    book = ledger(source)
    return {"session": _totals(book.session), "turns": [dict(_totals(t), turn=n) for n, t in book.turns.items()]}
