"""What a session used and what it cost: ``ledger(log)`` folds the log into per-request, step,
turn and session usage (docs/usage.md), priced by a pluggable pricer (``genai-prices`` by
default, the ``kerman[prices]`` extra)."""

from ._budget import Budget
from ._ledger import Fold, Ledger, Pricer, Request, Totals, ledger, summary_line
from ._prices import default_pricer, genai_prices_pricer

__all__ = ["Budget", "ledger", "Ledger", "Request", "Totals", "Fold", "Pricer", "genai_prices_pricer", "default_pricer", "summary_line"]
