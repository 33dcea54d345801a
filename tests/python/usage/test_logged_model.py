"""The model that answered, logged with each request's usage by Kerman's providers, prices the
ledger without naming a model; a log written before (no ``model`` in the usage) still reads,
priced with the model the ledger is given."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Dict, List, Optional

from kerman.usage import ledger


def session(usage: Dict[str, Any]) -> List[Dict[str, Any]]:
    message = {"id": "a", "role": "assistant", "content": [{"type": "text", "text": "ok"}]}
    return [
        {"type": "turn/start", "seq": 0, "time": 0, "data": {"turn": 1}},
        {"type": "step/start", "seq": 1, "time": 0, "data": {"turn": 1, "step": 1}},
        # A streamed attempt that failed after reporting partial usage, then the retry's reply.
        {"type": "assistant/chunk", "seq": 2, "time": 5, "data": {"turn": 1, "step": 1, "chunk": dict(usage, type="usage", partial=True)}},
        {"type": "assistant/message", "seq": 3, "time": 9, "data": {"turn": 1, "step": 1, "message": message, "usage": usage}},
        {"type": "step/end", "seq": 4, "time": 9, "data": {"turn": 1, "step": 1}},
        {"type": "turn/end", "seq": 5, "time": 9, "data": {"turn": 1, "reason": {"kind": "completed"}}},
    ]


def test_the_logged_model_and_provider_price_each_request():
    seen: List[Any] = []

    def pricer(request: Any) -> Optional[Decimal]:
        seen.append((request.model, request.provider))
        return Decimal("0.5") if request.model == "gpt-4o-2024-08-06" else None

    usage = {"input": 10, "output": 2, "model": "gpt-4o-2024-08-06", "provider": "openai"}
    book = ledger(session(usage), pricer=pricer, model="other", provider="other")
    assert seen == [("gpt-4o-2024-08-06", "openai")] * 2
    assert [(r.outcome, r.model, r.provider) for r in book.requests] == [
        ("failed", "gpt-4o-2024-08-06", "openai"),
        ("completed", "gpt-4o-2024-08-06", "openai"),
    ]
    assert book.session.cost == Decimal("1.0")
    assert book.to_dict()["requests"][1]["model"] == "gpt-4o-2024-08-06"


def test_an_old_log_without_the_model_is_priced_with_the_ledgers_default():
    book = ledger(session({"input": 10, "output": 2}), pricer=lambda r: Decimal(1) if r.model == "small" else None, model="small")
    assert [r.model for r in book.requests] == ["small", "small"] and book.session.cost == Decimal(2)
    assert ledger(session({"input": 10, "output": 2}), pricer=lambda r: Decimal(1) if r.model else None).session.cost is None
