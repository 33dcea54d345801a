"""Prices: the default pricer on ``genai-prices`` (the ``kerman[prices]`` extra), imported only
when a ledger is priced."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

if TYPE_CHECKING:
    from ._ledger import Request

__all__ = ["genai_prices_pricer", "default_pricer", "model_of"]

# A provider's wire protocol -> genai-prices' provider id.
_PROVIDERS = {"openai-chat": "openai", "openai-responses": "openai", "anthropic": "anthropic", "gemini": "google"}


def model_of(model: Any) -> Tuple[Optional[str], Optional[str]]:
    """(model name, provider id) of a loop's model when it is one of Kerman's providers."""
    name = getattr(model, "model", None)
    protocol = getattr(model, "protocol", None)
    return (name if isinstance(name, str) else None, _PROVIDERS.get(protocol) if isinstance(protocol, str) else None)


def genai_prices_pricer() -> Callable[[Request], Optional[Decimal]]:
    """A pricer on ``genai-prices``: a request's price from its model (and provider, when known)
    and its token counts, or ``None`` when genai-prices knows no price for that model. Raises
    ``ImportError`` naming the extra when genai-prices is not installed."""
    try:
        from genai_prices import Usage, calc_price
    except ImportError as e:  # pragma: no cover - exercised without the extra
        raise ImportError("pricing needs genai-prices: pip install 'kerman[prices]'") from e

    def price(request: Request) -> Optional[Decimal]:
        if not request.model:
            return None
        t = request.totals
        # genai-prices counts cached tokens inside input_tokens, as the vendors' prompt counts do.
        usage = Usage(input_tokens=t.prompt, cache_read_tokens=t.cache_read, cache_write_tokens=t.cache_write, output_tokens=t.output)
        try:
            return Decimal(calc_price(usage, request.model, provider_id=request.provider).total_price)
        except LookupError:
            return None

    return price


def default_pricer() -> Optional[Callable[[Request], Optional[Decimal]]]:
    """``genai_prices_pricer()`` when genai-prices is installed, else ``None`` (costs unknown)."""
    try:
        return genai_prices_pricer()
    except ImportError:
        return None
