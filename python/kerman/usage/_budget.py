"""Budgets: ``AgentLoop(budget=Budget(...))`` limits what a turn or a session may spend
(docs/usage.md#budgets). The rule lives in the core, which folds the log; this module holds the
limits and prices each request for a USD limit (the price is logged with the request's usage,
``costUsd``, so the log alone says what was spent)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any, AsyncIterator, Callable, Dict, Optional, Union

__all__ = ["Budget", "priced_model"]

_PER = ("turn", "session")


def _count(name: str, value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"Budget {name} must be an int >= 0 or None, got {value!r}")
    return value


def _usd(value: Any) -> Optional[Decimal]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"Budget usd must be a number >= 0 or None, got {value!r}")
    try:
        usd = Decimal(str(value)) if isinstance(value, (int, float, str)) else Decimal(value)
    except (InvalidOperation, TypeError, ValueError):
        raise ValueError(f"Budget usd must be a number >= 0 or None, got {value!r}") from None
    if not usd.is_finite() or usd < 0:
        raise ValueError(f"Budget usd must be a number >= 0 or None, got {value!r}")
    return usd


class Budget:
    """What a loop may spend: ``usd`` (priced by ``pricer``, genai-prices by default),
    ``tokens`` (prompt and output), model ``requests`` and ``tool_calls``, counted ``per``
    turn or over the whole session. The loop checks it when input is claimed and before every
    model request; a spent budget ends the turn ``{"kind": "budget", ...}`` with the limit
    and the numbers. A limit is overshot by at most the request in flight (and its reply's tool
    calls). ``ask=True``: a stop before a model request asks a person instead (a ``budget``
    decision request: ``Approve()`` lets that request through, ``Deny(reason)`` ends the turn);
    the stop at the claim stays a plain stop."""

    __slots__ = ("usd", "tokens", "requests", "tool_calls", "per", "pricer", "ask")

    def __init__(
        self,
        usd: Union[Decimal, float, int, str, None] = None,
        tokens: Optional[int] = None,
        requests: Optional[int] = None,
        tool_calls: Optional[int] = None,
        per: str = "session",
        *,
        pricer: Any = "default",
        ask: bool = False,
    ) -> None:
        self.usd = _usd(usd)
        self.tokens = _count("tokens", tokens)
        self.requests = _count("requests", requests)
        self.tool_calls = _count("tool_calls", tool_calls)
        if per not in _PER:
            raise ValueError(f"Budget per must be 'turn' or 'session', got {per!r}")
        self.per = per
        if self.usd is None and self.tokens is None and self.requests is None and self.tool_calls is None:
            raise ValueError("Budget needs at least one limit: usd, tokens, requests or tool_calls")
        if pricer != "default" and pricer is not None and not callable(pricer):
            raise TypeError(f"Budget pricer must be a callable pricer(request) -> Decimal | None or 'default', got {pricer!r}")
        self.pricer = pricer
        self.ask = ask

    def __repr__(self) -> str:
        parts = [
            f"{name}={getattr(self, name)!r}" for name in ("usd", "tokens", "requests", "tool_calls") if getattr(self, name) is not None
        ]
        ask = ", ask=True" if self.ask else ""
        return f"Budget({', '.join(parts)}, per={self.per!r}{ask})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Budget):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in ("usd", "tokens", "requests", "tool_calls", "per", "pricer", "ask"))

    __hash__ = None  # type: ignore[assignment]

    def install(self, core: Any) -> None:
        """Hands the limits to the loop's core (``LoopCore.set_budget``)."""
        core.set_budget(
            tokens=self.tokens,
            requests=self.requests,
            tool_calls=self.tool_calls,
            usd=None if self.usd is None else float(self.usd),
            per=self.per,
            ask=bool(self.ask),
        )


def _price(
    pricer: Callable[[Any], Optional[Decimal]], usage: Dict[str, Any], model: Optional[str], provider: Optional[str]
) -> Optional[Decimal]:
    from ._ledger import Request, request_totals

    name = usage.get("model") if isinstance(usage.get("model"), str) else model
    vendor = usage.get("provider") if isinstance(usage.get("provider"), str) else provider
    totals = request_totals(usage, False, False, 0)
    request = Request(0, 0, (), "completed", usage, False, 0, 0, name, vendor, totals)
    if not totals.tokens:
        return Decimal(0)
    return pricer(request)


def priced_model(model: Any, budget: Budget) -> Any:
    """``model`` whose replies' usage carries its price (``costUsd``, a decimal string), for a
    budget with a USD limit: the core reads the price from the log. A price that is unknown is
    left out, and the budget then stops (it cannot tell what was spent)."""
    from ._prices import default_pricer, model_of

    pricer = default_pricer() if budget.pricer == "default" else budget.pricer
    if pricer is None:
        raise ImportError("Budget(usd=...) prices requests with genai-prices: pip install 'kerman[prices]', or pass Budget(pricer=...)")
    name, provider = model_of(model)

    def priced(usage: Any) -> Any:
        if not isinstance(usage, dict) or "costUsd" in usage:
            return usage
        price = _price(pricer, usage, name, provider)
        return usage if price is None else dict(usage, costUsd=str(price))

    async def stream(chunks: Any) -> AsyncIterator[Any]:
        try:
            async for chunk in chunks:
                if isinstance(chunk, dict) and chunk.get("type") == "usage":
                    chunk = priced(chunk)
                yield chunk
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()

    async def reply_of(awaitable: Any) -> Any:
        reply = await awaitable
        if hasattr(reply, "__anext__"):
            return stream(reply)
        if getattr(reply, "usage", None) is not None:
            reply.usage = priced(reply.usage)
        return reply

    def call(request: Any) -> Any:
        produced = model(request)
        if hasattr(produced, "__anext__"):
            return stream(produced)
        if hasattr(produced, "__await__"):
            return reply_of(produced)
        if getattr(produced, "usage", None) is not None:  # a reply returned, not awaited
            produced.usage = priced(produced.usage)
        return produced

    call.model = getattr(model, "model", None)  # type: ignore[attr-defined]
    call.protocol = getattr(model, "protocol", None)  # type: ignore[attr-defined]
    call.__wrapped__ = model  # type: ignore[attr-defined]
    return call
