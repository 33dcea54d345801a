"""OpenTelemetry traces derived from the log (docs/tracing.md): ``export(log)`` after the fact,
``instrument(loop)`` live, ``encode(log)`` as OTLP. Needs the ``kerman[otel]`` extra
(``opentelemetry-api`` and ``-sdk``); ``import kerman`` does not import this module. Spans go
through the SDK (``tracer_provider=``, your processors) or, for OTLP, are folded and encoded
by the core (``otlp=True``/``endpoint=``: no Python object per event or span)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

try:
    import opentelemetry.sdk.trace  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised without the extra
    raise ImportError("kerman.otel needs the OpenTelemetry SDK: pip install 'kerman[otel]'") from e

from .. import events as ev
from .._core import SessionLog
from ..usage._prices import model_of
from ._live import Instrumentation, NativeInstrumentation
from ._native import DEFAULT_ENDPOINT, OtlpSender, endpoint_from_env, headers_from_env, native_spans
from ._spans import LATEST, SpanBuilder, latest_conventions, span_id_of, trace_id_of

__all__ = [
    "export",
    "encode",
    "instrument",
    "Instrumentation",
    "NativeInstrumentation",
    "OtlpSender",
    "SpanBuilder",
    "trace_id_of",
    "span_id_of",
    "latest_conventions",
    "LATEST",
]


def export(
    log: Any,
    tracer_provider: Any = None,
    *,
    agent_name: str = "kerman",
    model: Optional[str] = None,
    provider: Optional[str] = None,
    latest: Optional[bool] = None,
) -> int:
    """Builds the spans of ``log`` (a ``SessionLog`` or an ``AgentLoop``'s log) on
    ``tracer_provider`` (default: the global one): returns how many turns were exported. A turn
    still open has no span yet. Exporting a log twice gives spans with the same ids."""
    log, session, model, provider = _source(log, model, provider)
    builder = SpanBuilder(session, tracer_provider, agent_name=agent_name, model=model, provider=provider, latest=latest)
    turns = 0
    for view in log.events(view=True):
        builder.add(view)
        turns += view.__class__ is ev.TurnEnd
    builder.finish()
    return turns


def _source(source: Any, model: Optional[str], provider: Optional[str]) -> Any:
    log = getattr(source, "log", None)
    if log is not None and not hasattr(source, "events"):
        guessed_model, guessed_provider = model_of(getattr(source, "_model", None))
        return log, log.id, model or guessed_model, provider or guessed_provider
    if not hasattr(source, "events") or not hasattr(source, "id"):
        raise TypeError(f"export needs a SessionLog or an AgentLoop, got {type(source).__name__}")
    return source, source.id, model, provider


def encode(
    log: Any,
    *,
    format: str = "protobuf",
    agent_name: str = "kerman",
    model: Optional[str] = None,
    provider: Optional[str] = None,
    latest: Optional[bool] = None,
    resource: Any = None,
) -> Union[bytes, str, None]:
    """The spans of ``log`` (a ``SessionLog``, an ``AgentLoop``, or anything with ``id`` and
    ``events()`` giving ``kerman.Event``s) as one OTLP ``ExportTraceServiceRequest``, folded and
    encoded by the core: ``format="protobuf"`` (bytes, the OTLP/HTTP body) or ``"json"``
    (OTLP/JSON text, ids in hex). The same spans and ids as ``export``; ``None`` when no span
    ended. ``resource``: an SDK ``Resource`` or a mapping (default: ``Resource.create()``)."""
    log, session, model, provider = _source(log, model, provider)
    spans = native_spans(
        session,
        agent_name=agent_name,
        model=model,
        provider=provider,
        latest=latest_conventions() if latest is None else latest,
        resource=resource,
    )
    if isinstance(log, SessionLog):
        spans.read(log)
    else:
        spans.add(log.events())
    spans.finish()
    if format not in ("protobuf", "json"):
        raise ValueError(f"format must be 'protobuf' or 'json', got {format!r}")
    return spans.take("json") if format == "json" else spans.take("protobuf")


def instrument(
    loop: Any,
    tracer_provider: Any = None,
    *,
    agent_name: str = "kerman",
    model: Optional[str] = None,
    provider: Optional[str] = None,
    latest: Optional[bool] = None,
    interval: float = 0.5,
    otlp: Optional[bool] = None,
    endpoint: Optional[str] = None,
    headers: Optional[Mapping[str, str]] = None,
    timeout: float = 10.0,
    resource: Any = None,
) -> Instrumentation:
    """Exports ``loop``'s spans live (and those of the events its log holds already): a thread
    of its own reads the log every ``interval`` seconds and exports each span the log shows
    ended. Returns the ``Instrumentation`` (``close()`` it when done; closing the loop does
    not).

    Two paths (docs/tracing.md, "Live"): with ``tracer_provider`` (or the global one), SDK spans
    go through your processors. With ``otlp=True`` or an ``endpoint``, or when no
    ``tracer_provider`` is given and ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (and ``otlp`` is not ``False``), the core folds and
    encodes the spans and the thread posts them to the OTLP/HTTP ``endpoint`` (default: from
    those variables, else ``http://localhost:4318/v1/traces``) with ``headers`` (default:
    ``OTEL_EXPORTER_OTLP_HEADERS``), retrying 429/502/503/504 for up to ``timeout`` seconds;
    ``resource`` as for ``encode``."""
    if not interval > 0:
        raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
    native = bool(otlp) or endpoint is not None or (otlp is None and tracer_provider is None and endpoint_from_env() is not None)
    if native and tracer_provider is not None:
        raise ValueError("instrument takes a tracer_provider (SDK spans) or otlp=True/endpoint= (native OTLP), not both")
    log, session, model, provider = _source(loop, model, provider)
    use_latest = latest_conventions() if latest is None else latest
    if native:
        spans = native_spans(session, agent_name=agent_name, model=model, provider=provider, latest=use_latest, resource=resource)
        sender = OtlpSender(
            endpoint or endpoint_from_env() or DEFAULT_ENDPOINT, headers_from_env() if headers is None else headers, timeout
        )
        return NativeInstrumentation(log, spans, sender, interval)
    builder = SpanBuilder(session, tracer_provider, agent_name=agent_name, model=model, provider=provider, latest=use_latest)
    return Instrumentation(log, builder, interval)
