"""Spans built from a session's log, following OpenTelemetry's GenAI semantic conventions: one
``invoke_agent`` span per turn, a ``chat`` span per model request (its usage from
``kerman.usage``) and an ``execute_tool`` span per tool call, each made when the log shows it
ended. Trace and span ids are derived from the session id and log positions, never drawn at
random, so exporting a log twice gives the same ids, and a turn that waited for a decision, or
crashed and was continued in another process, stays one trace."""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Any, Dict, Optional, Tuple

from opentelemetry import trace
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from .. import __version__
from .. import events as ev
from ..usage import Fold, Request

__all__ = ["SpanBuilder", "latest_conventions", "trace_id_of", "span_id_of"]

#: The value of ``OTEL_SEMCONV_STABILITY_OPT_IN`` that selects the latest experimental GenAI
#: conventions (``gen_ai.provider.name``, the cache token attributes); without it the spans
#: follow the conventions of v1.36.0 (``gen_ai.system``), as OpenTelemetry's transition asks.
LATEST = "gen_ai_latest_experimental"

# Turn endings that mean the work failed (the others, cancelled or rejected included, did what
# was asked of them).
FAILED_ENDINGS = ("error", "interrupted")


def latest_conventions() -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` opts in to the latest GenAI conventions."""
    return LATEST in {v.strip() for v in os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "").split(",")}


_WORD = (1 << 64) - 1


def _key(session: str) -> Tuple[int, int, int]:
    """The words an id of ``session`` is mixed from: SHA-256 of ``kerman\0{session}`` as four
    big-endian 64-bit words (the first three used)."""
    k0, k1, k2, _ = struct.unpack(">4Q", hashlib.sha256(f"kerman\0{session}".encode()).digest())
    return k0, k1, k2


def _mix(z: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers, so distinct seqs get distinct ids."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _WORD
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _WORD
    return z ^ (z >> 31)


def _trace_id(key: Tuple[int, int, int], seq: int) -> int:
    return (_mix(key[1] ^ seq) << 64 | _mix(key[2] ^ seq)) or 1  # 0 is the invalid id


def _span_id(key: Tuple[int, int, int], seq: int) -> int:
    return _mix(key[0] ^ seq) or 1


def trace_id_of(session: str, seq: int) -> int:
    """The trace id of the turn that started at ``seq`` (and of the turns that continue it)."""
    return _trace_id(_key(session), seq)


def span_id_of(session: str, seq: int) -> int:
    """The span id of the span that the event at ``seq`` opens."""
    return _span_id(_key(session), seq)


class _Ids(IdGenerator):
    """Hands out the ids the builder computed for the next span (its tracer's ids only)."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_id = 0

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id

    def is_trace_id_random(self) -> bool:
        return False


class _Turn:
    __slots__ = ("turn", "seq", "time", "trace_id", "span_id", "parent")

    def __init__(self, turn: int, seq: int, time: int, trace_id: int, span_id: int, parent: Optional[SpanContext]) -> None:
        self.turn = turn
        self.seq = seq
        self.time = time
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent = parent

    def context(self) -> SpanContext:
        return SpanContext(self.trace_id, self.span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _ns(ms: int) -> int:
    return int(ms) * 1_000_000


class SpanBuilder:
    """Folds events (``add``) into spans on ``tracer_provider`` (the global one by default).
    ``session``: the session id (ids and ``gen_ai.conversation.id``); ``model``/``provider``
    name what served requests whose model the log does not record; ``latest``: the convention
    version (default: ``OTEL_SEMCONV_STABILITY_OPT_IN``)."""

    def __init__(
        self,
        session: str,
        tracer_provider: Any = None,
        *,
        agent_name: str = "kerman",
        model: Optional[str] = None,
        provider: Optional[str] = None,
        latest: Optional[bool] = None,
    ) -> None:
        provider_ = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self.tracer = provider_.get_tracer("kerman.otel", __version__)
        self.ids = _Ids()
        if hasattr(self.tracer, "id_generator"):
            # The SDK's tracer draws ids from its own generator: this tracer (made for this
            # builder alone) gets one that returns the derived ids.
            self.tracer.id_generator = self.ids
        self.session = session
        self.key = _key(session)
        self.agent_name = agent_name
        self.model = model
        self.provider = provider
        self.latest = latest_conventions() if latest is None else latest
        self.fold = Fold(None, model, provider)
        self.turns: Dict[int, _Turn] = {}
        self.calls: Dict[str, Tuple[int, int, str, int]] = {}  # call id -> (seq, time, name, turn)
        self.continues: Optional[_Turn] = None  # an interrupted turn the next turn continues
        self.last_time = 0

    # -- the fold --

    def add(self, event: ev.EventView) -> None:
        view: Any = event  # dispatched on the exact class, which mypy does not narrow
        seen = len(self.fold.requests)
        self.fold.add(view)
        for request in self.fold.requests[seen:]:
            self._chat(request)
        self.last_time = view.time
        cls = view.__class__
        if cls is ev.TurnStart:
            self._turn_start(view)
        elif cls is ev.TurnEnd:
            self._turn_end(view)
        elif cls is ev.ToolCall:
            self.calls[view.call_id] = (view.seq, view.time, view.name, view.turn)
        elif cls is ev.ToolResultEvent:
            self._tool_result(view)

    def finish(self) -> None:
        """Settles what the log ended during (a request in flight); a turn still open gets no
        span (it is made when the turn ends)."""
        seen = len(self.fold.requests)
        self.fold.finish()
        for request in self.fold.requests[seen:]:
            self._chat(request)

    # -- spans --

    def _start(
        self, name: str, kind: SpanKind, trace_id: int, span_id: int, parent: Optional[SpanContext], start: int, attributes: Dict[str, Any]
    ) -> Any:
        self.ids.trace_id, self.ids.span_id = trace_id, span_id
        context = trace.set_span_in_context(NonRecordingSpan(parent)) if parent is not None else None
        if context is None:
            # A root span: an empty context, so a span current in the caller is not its parent.
            from opentelemetry.context import Context

            context = Context()
        return self.tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=_ns(start))

    def _common(self, operation: str) -> Dict[str, Any]:
        return {"gen_ai.operation.name": operation, "gen_ai.conversation.id": self.session}

    def _turn_start(self, view: Any) -> None:
        before = self.continues
        self.continues = None
        if before is not None:
            # The turn after one a crash interrupted continues its work: the same trace, under it.
            turn = _Turn(view.turn, view.seq, view.time, before.trace_id, _span_id(self.key, view.seq), before.context())
        else:
            turn = _Turn(view.turn, view.seq, view.time, _trace_id(self.key, view.seq), _span_id(self.key, view.seq), None)
        self.turns[view.turn] = turn

    def _turn_end(self, view: Any) -> None:
        turn = self.turns.pop(view.turn, None)
        if turn is None:
            return
        kind = view.reason.kind or "unknown"
        attributes = self._common("invoke_agent")
        attributes.update({"gen_ai.agent.name": self.agent_name, "kerman.turn": turn.turn, "kerman.turn.end": kind})
        if self.model:
            attributes["gen_ai.request.model"] = self.model
        name = f"invoke_agent {self.agent_name}"
        span = self._start(name, SpanKind.INTERNAL, turn.trace_id, turn.span_id, turn.parent, turn.time, attributes)
        if kind in FAILED_ENDINGS:
            error = view.reason.error
            span.set_attribute("error.type", (error.code if error is not None and error.code else None) or kind)
            span.set_status(Status(StatusCode.ERROR, error.message if error is not None else kind))
        span.end(end_time=_ns(view.time))
        self.continues = turn if kind == "interrupted" else None

    def _chat(self, request: Request) -> None:
        turn = self.turns.get(request.turn)
        if turn is None:
            return
        t = request.totals
        model = request.model
        attributes = self._common("chat")
        if model:
            attributes["gen_ai.request.model"] = model
        if request.provider:
            attributes["gen_ai.provider.name" if self.latest else "gen_ai.system"] = request.provider
        if request.usage is not None:
            # input_tokens is the whole prompt, cached tokens included, as the conventions count it
            attributes["gen_ai.usage.input_tokens"] = t.prompt
            attributes["gen_ai.usage.output_tokens"] = t.output
            if self.latest:
                attributes["gen_ai.usage.cache_read.input_tokens"] = t.cache_read
                attributes["gen_ai.usage.cache_creation.input_tokens"] = t.cache_write
            attributes["kerman.usage.reasoning_tokens"] = t.reasoning
        attributes["kerman.step"] = request.step
        attributes["kerman.request.outcome"] = request.outcome
        if request.partial:
            attributes["kerman.usage.partial"] = True
        if request.outcome in ("completed", "max-tokens"):
            attributes["gen_ai.response.finish_reasons"] = ["length" if request.outcome == "max-tokens" else "stop"]
        name = f"chat {model}" if model else "chat"
        span = self._start(
            name, SpanKind.CLIENT, turn.trace_id, _span_id(self.key, request.seqs[0]), turn.context(), request.started, attributes
        )
        if request.outcome in ("failed", "interrupted"):
            span.set_attribute("error.type", request.outcome)
            span.set_status(Status(StatusCode.ERROR, f"the request {request.outcome}"))
        span.end(end_time=_ns(request.ended))

    def _tool_result(self, view: Any) -> None:
        call = self.calls.pop(view.call_id, None)
        if call is None:
            return  # a closer's result for a call that never started: nothing ran
        seq, time, name, turn_number = call
        turn = self.turns.get(turn_number)
        if turn is None:
            return
        attributes = self._common("execute_tool")
        attributes.update({"gen_ai.tool.name": name, "gen_ai.tool.call.id": view.call_id, "gen_ai.tool.type": "function"})
        span = self._start(
            f"execute_tool {name}", SpanKind.INTERNAL, turn.trace_id, _span_id(self.key, seq), turn.context(), time, attributes
        )
        error = view.error
        if error is not None or view.is_error:
            code = (error.code if error is not None else None) or "tool_error"
            span.set_attribute("error.type", code)
            span.set_status(Status(StatusCode.ERROR, error.message if error is not None else view.text[:200]))
        span.end(end_time=_ns(view.time))
