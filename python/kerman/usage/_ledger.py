"""The usage ledger: a fold of a session's log into what each model request used, summed per
step, turn and session. A pure function of the log (no loop state): the same log gives the same
ledger in any process, after a crash or a restart."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .. import events as ev

__all__ = ["Totals", "Request", "Ledger", "ledger", "Fold", "summary_line"]

#: ``pricer(request) -> Decimal | None``: the price in USD of one request (``None``: unknown).
Pricer = Callable[["Request"], Optional[Decimal]]


@dataclass(frozen=True)
class Totals:
    """Usage summed over some requests. Token counts never overlap: ``input`` is the prompt
    tokens neither read from nor written to the provider's cache, so ``input + cache_read +
    cache_write`` is the whole prompt, and ``reasoning`` is the part of ``output`` spent
    thinking. ``cost`` (USD) is ``None`` when the price of any request is unknown (never 0
    for unknown): its model has no known price, or it reported no usage; ``unpriced`` counts
    those requests and ``known_cost`` sums the prices that are known. ``partial`` counts
    requests whose usage is what the stream reported before it stopped; ``failed`` the requests
    that got no message (failed and retried, or cut by a crash; not one a cancellation cut,
    whose outcome is ``interrupted``). ``model_ms``: wall time the requests
    took, as the log's times show it."""

    input: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0
    reasoning: int = 0
    requests: int = 0
    failed: int = 0
    partial: int = 0
    tool_calls: int = 0
    model_ms: int = 0
    cost: Optional[Decimal] = Decimal(0)
    unpriced: int = 0
    known_cost: Decimal = Decimal(0)

    @property
    def prompt(self) -> int:
        """Every prompt token: ``input + cache_read + cache_write``."""
        return self.input + self.cache_read + self.cache_write

    @property
    def tokens(self) -> int:
        """Every token, prompt and output."""
        return self.prompt + self.output

    def __add__(self, other: Totals) -> Totals:
        if not isinstance(other, Totals):
            return NotImplemented
        cost = None if self.cost is None or other.cost is None else self.cost + other.cost
        return Totals(
            self.input + other.input,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
            self.output + other.output,
            self.reasoning + other.reasoning,
            self.requests + other.requests,
            self.failed + other.failed,
            self.partial + other.partial,
            self.tool_calls + other.tool_calls,
            self.model_ms + other.model_ms,
            cost,
            self.unpriced + other.unpriced,
            self.known_cost + other.known_cost,
        )

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict (``cost`` as a str of the exact decimal, or ``None``)."""
        return {
            "input": self.input,
            "cacheRead": self.cache_read,
            "cacheWrite": self.cache_write,
            "output": self.output,
            "reasoning": self.reasoning,
            "requests": self.requests,
            "failed": self.failed,
            "partial": self.partial,
            "toolCalls": self.tool_calls,
            "modelMs": self.model_ms,
            "costUsd": None if self.cost is None else str(self.cost),
            "unpriced": self.unpriced,
            "knownCostUsd": str(self.known_cost),
        }

    def summary(self) -> str:
        """One line: requests, tokens by kind, tool calls and cost."""
        cost = f"${self.cost:.4f}" if self.cost is not None else "cost unknown"
        if self.cost is None and self.known_cost:
            cost += f" (${self.known_cost:.4f} known, {self.unpriced} unpriced)"
        extra = []
        if self.failed:
            extra.append(f"{self.failed} failed")
        if self.partial:
            extra.append(f"{self.partial} partial")
        requests = f"{self.requests} requests" + (f" ({', '.join(extra)})" if extra else "")
        return (
            f"{requests}, {self.input} in + {self.cache_read} cache read + {self.cache_write} cache write, "
            f"{self.output} out ({self.reasoning} reasoning), {self.tool_calls} tool calls, {cost}"
        )


@dataclass(frozen=True)
class Request:
    """One model request as the log shows it. ``outcome``: ``"completed"``, ``"max-tokens"``,
    ``"interrupted"`` (a cancellation cut it once the model was called: its message is what was
    visible; with nothing visible, no message, its chunks end with the loop's ``cancelled``
    finish, and its ``usage`` is ``None`` unless the stream reported some) or
    ``"failed"`` (no message: the request failed, was retried, or the process stopped during
    it). ``usage`` is the normalised usage as logged (``None``: nothing reported); ``partial``
    says it is what the stream reported before it stopped. ``seqs``: the log positions the
    request occupies (its chunks and its message). ``model``/``provider``: what the pricer was
    told: the model that answered and its provider as Kerman's providers log them with the
    usage (or, for a failed request, named with its failed ``finish``, as a ``Fallback`` does),
    else the request's ``model`` option when one was logged, else the ledger's defaults."""

    turn: int
    step: int
    seqs: Tuple[int, ...]
    outcome: str
    usage: Optional[Dict[str, Any]]
    partial: bool
    started: int
    ended: int
    model: Optional[str] = None
    provider: Optional[str] = None
    totals: Totals = field(default_factory=Totals)
    #: ``"reply"``: a request of the loop; ``"compaction"``: an LLM summary's request (its
    #: ``context/compacted`` record's seq in ``seqs``, ``model`` the summary model's).
    kind: str = "reply"

    @property
    def cost(self) -> Optional[Decimal]:
        return self.totals.cost


def _count(usage: Dict[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if value.__class__ is int and value > 0 else 0


def request_totals(usage: Optional[Dict[str, Any]], failed: bool, partial: bool, ms: int) -> Totals:
    """One request's totals, the prompt split so that no token counts twice (every provider logs
    ``input`` with the cached tokens included, docs/providers.md "Usage")."""
    u = usage or {}
    read, write = _count(u, "cacheRead"), _count(u, "cacheWrite")
    return Totals(
        input=max(0, _count(u, "input") - read - write),
        cache_read=read,
        cache_write=write,
        output=_count(u, "output"),
        reasoning=_count(u, "reasoning"),
        requests=1,
        failed=int(failed),
        partial=int(partial),
        model_ms=max(0, ms),
    )


class Fold:
    """The ledger's fold, one event at a time (``add``), for a reader that follows a live log.
    ``requests`` and ``tool_calls`` grow as events arrive; a request whose chunks arrived but
    whose end is not yet known stays pending until the next event that settles it
    (``finish()`` settles it as failed: the log ended during it)."""

    def __init__(self, pricer: Optional[Pricer] = None, model: Optional[str] = None, provider: Optional[str] = None) -> None:
        self.pricer = pricer
        self.model = model
        self.provider = provider
        self.requests: List[Request] = []
        self.tool_calls: Dict[Tuple[int, int], int] = {}
        self.turns: List[int] = []
        self._option_model: Optional[str] = None
        self._turn = 0
        self._step = 0
        self._last_time = 0  # the time of the last event that is not a chunk: a request starts after it
        # The chunks of the request(s) in flight: (seq, time, chunk view), and each attempt's start.
        self._chunks: List[Tuple[int, int, Any]] = []
        self._start = 0

    # -- the fold --

    def add(self, event: ev.EventView) -> None:
        view: Any = event  # dispatched on the exact class below (faster than isinstance), which mypy does not narrow
        cls = view.__class__
        if cls is ev.AssistantChunk:
            if not self._chunks:
                self._start = self._last_time
            chunk = view.chunk
            self._chunks.append((view.seq, view.time, chunk))
            # A failed finish, or a usage the provider marked partial, ends an attempt that gets
            # no message: the next chunk belongs to another request (a retry).
            if (isinstance(chunk, ev.FinishChunk) and chunk.reason not in ("stop", "max-tokens")) or (
                isinstance(chunk, ev.UsageChunk) and chunk.raw.get("partial") is True
            ):
                self._settle_chunks(view.time)
            return
        if cls is ev.AssistantMessageEvent:
            self._message(view)
        else:
            if self._chunks and cls in _SETTLING:
                self._settle_chunks(self._chunks[-1][1])
            if cls is ev.ToolCall:
                key = (view.turn, view.step)
                self.tool_calls[key] = self.tool_calls.get(key, 0) + 1
            elif cls is ev.TurnStart:
                self._turn, self._step = view.turn, 0
                self.turns.append(view.turn)
            elif cls is ev.StepStart:
                self._turn, self._step = view.turn, view.step
            elif cls is ev.ContextCompacted:
                self._compacted(view)
            elif cls is ev.RequestHeader:
                model = view.options.get("model")
                self._option_model = model if isinstance(model, str) else None
        self._last_time = view.time

    def finish(self) -> None:
        """Settles the chunks still in flight: the log ended during a request."""
        if self._chunks:
            self._settle_chunks(self._chunks[-1][1])

    def _message(self, view: Any) -> None:
        cited = set(view.source_event_seqs or ())
        mine = [c for c in self._chunks if c[0] in cited]
        before = [c for c in self._chunks if c[0] not in cited]
        if before:
            self._chunks = before
            self._settle_chunks(before[-1][1])
        start = self._start if mine else self._last_time
        self._chunks = []
        raw_usage = view.data.get("usage") if isinstance(view.data, dict) else None
        usage = raw_usage if isinstance(raw_usage, dict) else None
        interrupted = view.interrupted
        if interrupted:
            outcome = "interrupted"
        else:
            outcome = "max-tokens" if _finish_of(mine) == "max-tokens" else "completed"
        partial = interrupted or bool(usage and usage.get("partial") is True)
        seqs = tuple(c[0] for c in mine) + (view.seq,)
        self._record(view.turn, view.step, seqs, outcome, usage, partial, start, view.time)
        self._last_time = view.time

    def _compacted(self, view: Any) -> None:
        """A compaction that made a request (an LLM summary) counts as one, in the turn it was
        made in (or the last one, between turns)."""
        usage = view.usage
        if usage is None and view.model is None:
            return  # no model asked: nothing to count
        turn = view.turn if view.turn is not None else self._turn
        step = self._step if view.turn is not None else 0
        option_model, self._option_model = self._option_model, view.model
        try:
            self._record(
                turn,
                step,
                (view.seq,),
                "completed",
                None if usage is None else dict(usage.raw),
                False,
                view.time,
                view.time,
                kind="compaction",
            )
        finally:
            self._option_model = option_model

    def _settle_chunks(self, end: int) -> None:
        """The chunks in flight are one request that got no message: a failed attempt, or, ended
        by the loop's ``cancelled`` finish, one a cancellation cut before anything visible was
        logged (``interrupted``). A failed ``finish`` that names a ``model`` (a ``Fallback``
        names each model it tried) says what it is priced as, unless its usage names one."""
        chunks, self._chunks = self._chunks, []
        usage: Optional[Dict[str, Any]] = None
        named: Tuple[Optional[str], Optional[str]] = (None, None)
        outcome = "failed"
        for _, _, chunk in chunks:
            if isinstance(chunk, ev.UsageChunk):
                usage = dict(usage or {}, **{k: v for k, v in chunk.raw.items() if k != "type"})
            elif isinstance(chunk, ev.FinishChunk):
                if chunk.model:
                    named = (chunk.model, chunk.provider)
                outcome = "interrupted" if chunk.reason == "cancelled" else "failed"
        start, self._start = self._start, end
        self._last_time = end
        partial = usage is not None
        self._record(self._turn, self._step, tuple(c[0] for c in chunks), outcome, usage, partial, start, end, named=named)

    def _record(
        self,
        turn: int,
        step: int,
        seqs: Tuple[int, ...],
        outcome: str,
        usage: Optional[Dict[str, Any]],
        partial: bool,
        start: int,
        end: int,
        kind: str = "reply",
        named: Tuple[Optional[str], Optional[str]] = (None, None),
    ) -> None:
        failed = outcome == "failed"
        totals = request_totals(usage, failed, partial, end - start)
        # Which model answered: what the provider logged with the usage, else the model a failed
        # finish named, else the request's `model` option, else the ledger's default (logs
        # written before providers logged it).
        logged = usage.get("model") if usage is not None else None
        vendor = usage.get("provider") if usage is not None else None
        model = logged if isinstance(logged, str) and logged else named[0] or self._option_model or self.model
        provider = vendor if isinstance(vendor, str) and vendor else named[1] or self.provider
        price: Optional[Decimal]
        if usage is None or (totals.tokens and self.pricer is None):
            price = None  # nothing reported, or nothing to price with: unknown, not free
        elif not totals.tokens:
            price = Decimal(0)
        else:
            price = self.pricer(Request(turn, step, seqs, outcome, usage, partial, start, end, model, provider, totals, kind))  # type: ignore[misc]
        if price is None:
            # the constructor, not dataclasses.replace: this runs once per request of a live fold
            t = totals
            totals = Totals(
                t.input, t.cache_read, t.cache_write, t.output, t.reasoning, t.requests, t.failed, t.partial, 0, t.model_ms, None, 1
            )
        elif price:
            totals = replace(totals, cost=price, known_cost=price)
        self.requests.append(Request(turn, step, seqs, outcome, usage, partial, start, end, model, provider, totals, kind))


def _finish_of(chunks: List[Tuple[int, int, Any]]) -> Optional[str]:
    for _, _, chunk in reversed(chunks):
        if isinstance(chunk, ev.FinishChunk):
            return chunk.reason
    return None


# Events after which chunks still in flight can no longer get their message: their request failed.
_SETTLING = frozenset({ev.StepEnd, ev.TurnEnd, ev.StepStart, ev.TurnStart, ev.RequestHeader, ev.ToolCall, ev.UserMessageEvent})


class Ledger:
    """What a session's model requests used (``kerman.usage.ledger(log)``): ``requests`` in log
    order, and ``session``, ``turn(n)``, ``step(turn, step)`` totals (tool calls included).
    ``turns`` maps each turn to its totals, ``steps`` each ``(turn, step)``."""

    def __init__(self, requests: List[Request], tool_calls: Dict[Tuple[int, int], int], turns: Iterable[int] = ()) -> None:
        self.requests = requests
        steps: Dict[Tuple[int, int], Totals] = {}
        for r in requests:
            key = (r.turn, r.step)
            steps[key] = steps.get(key, Totals()) + r.totals
        for key, n in tool_calls.items():
            steps[key] = steps.get(key, Totals()) + Totals(tool_calls=n)
        self.steps: Dict[Tuple[int, int], Totals] = dict(sorted(steps.items()))
        by_turn: Dict[int, Totals] = {t: Totals() for t in turns}
        for (turn, _), totals in self.steps.items():
            by_turn[turn] = by_turn.get(turn, Totals()) + totals
        self.turns: Dict[int, Totals] = dict(sorted(by_turn.items()))
        session = Totals()
        for totals in self.turns.values():
            session = session + totals
        self.session = session

    def turn(self, turn: int) -> Totals:
        """The totals of ``turn`` (zeros for a turn that used nothing or is not in the log)."""
        return self.turns.get(turn, Totals())

    def step(self, turn: int, step: int) -> Totals:
        return self.steps.get((turn, step), Totals())

    def to_dict(self) -> Dict[str, Any]:
        """The whole ledger as JSON-ready data (what ``kerman log usage --json`` prints)."""
        return {
            "session": self.session.to_dict(),
            "turns": [dict(turn=t, **totals.to_dict()) for t, totals in self.turns.items()],
            "requests": [
                dict(
                    turn=r.turn,
                    step=r.step,
                    seqs=list(r.seqs),
                    outcome=r.outcome,
                    partial=r.partial,
                    model=r.model,
                    provider=r.provider,
                    usage=r.usage,
                    **({"kind": r.kind} if r.kind != "reply" else {}),
                    **{k: v for k, v in r.totals.to_dict().items() if k not in ("requests", "failed", "partial", "toolCalls", "unpriced")},
                )
                for r in self.requests
            ],
        }

    def __repr__(self) -> str:
        return f"<Ledger turns={len(self.turns)} {self.session.summary()}>"

    def _repr_html_(self) -> str:
        from .._html import usage_ledger

        return usage_ledger(self)


def ledger(
    source: Any,
    *,
    pricer: Any = "default",
    model: Optional[str] = None,
    provider: Optional[str] = None,
) -> Ledger:
    """The usage ledger of ``source``: a ``SessionLog``, an ``AgentLoop`` (its log; its model's
    name and provider are the defaults for pricing) or an iterable of events.

    ``pricer``: ``"default"`` prices with ``genai-prices`` when it is installed (the
    ``kerman[prices]`` extra; without it every cost is unknown); ``None`` prices nothing (every
    cost is ``None``); or any callable ``pricer(request) -> Decimal | None``. ``model`` and
    ``provider`` name what served requests whose ``model`` the log does not record (a request's
    ``model`` option, when logged, wins)."""
    from ._prices import default_pricer, model_of

    log = getattr(source, "log", None)
    if log is not None and not hasattr(source, "events"):
        guessed_model, guessed_provider = model_of(getattr(source, "model", None) or getattr(source, "_model", None))
        model = model or guessed_model
        provider = provider or guessed_provider
        source = log
    if pricer == "default":
        pricer = default_pricer()
    elif pricer is not None and not callable(pricer):
        raise TypeError(f"pricer must be a callable pricer(request) -> Decimal | None, 'default' or None, got {pricer!r}")
    events = source.events(view=True) if hasattr(source, "events") else ev.views(source)
    fold = Fold(pricer, model, provider)
    for view in events:
        fold.add(view)
    fold.finish()
    return Ledger(fold.requests, fold.tool_calls, fold.turns)


#: The longest log a notebook view folds for its usage line (a longer one names the call instead).
SUMMARY_EVENTS = 50_000


def summary_line(source: Any) -> str:
    """The session's usage in one line for a view (``AgentLoop``'s notebook repr): bounded, and
    never raising (a pricer that fails is named instead of hiding the rest of the view)."""
    log = getattr(source, "log", source)
    n = len(log)
    if n > SUMMARY_EVENTS:
        return f"{n:,} events: kerman.usage.ledger(loop) folds them"
    try:
        return ledger(source).session.summary()
    except Exception as e:
        return f"not available ({type(e).__name__}: {e})"
