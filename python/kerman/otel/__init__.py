"""OpenTelemetry traces derived from the log (docs/tracing.md): ``export(log)`` after the fact,
``instrument(loop)`` live. Needs the ``kerman[otel]`` extra (``opentelemetry-api`` and
``-sdk``); ``import kerman`` does not import this module."""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

try:
    import opentelemetry.sdk.trace  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised without the extra
    raise ImportError("kerman.otel needs the OpenTelemetry SDK: pip install 'kerman[otel]'") from e

from .. import events as ev
from ..usage._prices import model_of
from ._spans import LATEST, SpanBuilder, latest_conventions, span_id_of, trace_id_of

__all__ = ["export", "instrument", "Instrumentation", "SpanBuilder", "trace_id_of", "span_id_of", "latest_conventions", "LATEST"]

_logger = logging.getLogger("kerman")


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


class Instrumentation:
    """A live exporter (``instrument(loop)``): a thread of its own reads what the log committed,
    in batches, and builds and exports the spans; the loop does nothing for it (no callback per
    event, no queue), so an exporter that raises or blocks never reaches the loop. The thread
    wakes every ``interval`` seconds, or at once for ``flush()``; ``close()`` stops it (after
    what the log held); ``errors`` counts the exceptions the builder or exporter raised (the
    first is logged)."""

    def __init__(self, log: Any, builder: SpanBuilder, interval: float = 0.5) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self.log = log
        self.builder = builder
        self.interval = interval
        self.errors = 0
        self.exported = -1  # the last seq built
        self._built = 0  # events [0, _built) are built
        self._wanted = 0  # flush() asks for [0, _wanted)
        self._stopping = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"kerman.otel {log.id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._changed:
                if not self._stopping and self._wanted <= self._built:
                    self._changed.wait(self.interval)
                stopping = self._stopping
            self._build()
            if stopping:
                return

    def _build(self) -> None:
        """Builds the events committed since the last batch, each on its own: one that fails is
        counted and the next one is built."""
        start = self._built
        try:
            end = len(self.log)
            events = self.log.events(start, end, view=True) if end > start else ()
        except Exception:  # a log closed under us: nothing more to read, the thread stops
            self._failed()
            end, events = start, ()
            with self._changed:
                self._stopping = True
        add = self.builder.add
        for view in events:
            try:
                add(view)
            except Exception:
                self._failed()
            self.exported = view.seq
        with self._changed:
            self._built = end
            self._changed.notify_all()

    def _failed(self) -> None:
        self.errors += 1
        if self.errors == 1:
            _logger.warning("kerman.otel: building or exporting the spans of %r failed", self.log.id, exc_info=True)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Waits until every event the log holds now is built (``False``: ``timeout`` passed
        first)."""
        target = len(self.log)
        with self._changed:
            self._wanted = max(self._wanted, target)
            self._changed.notify_all()
            return self._changed.wait_for(lambda: self._built >= target or not self._thread.is_alive(), timeout) and self._built >= target

    def close(self, timeout: Optional[float] = None) -> None:
        """Builds what the log holds, then stops the thread (waiting at most ``timeout`` seconds
        for a blocked exporter)."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._thread.join(timeout)

    def __repr__(self) -> str:
        state = "running" if self._thread.is_alive() else "stopped"
        return f"<Instrumentation session={self.log.id!r} {state} built_to={self.exported} errors={self.errors}>"


def instrument(
    loop: Any,
    tracer_provider: Any = None,
    *,
    agent_name: str = "kerman",
    model: Optional[str] = None,
    provider: Optional[str] = None,
    latest: Optional[bool] = None,
    interval: float = 0.5,
) -> Instrumentation:
    """Exports ``loop``'s spans live (and those of the events its log holds already): a thread
    of its own reads the log every ``interval`` seconds and builds each span the log shows
    ended. Returns the ``Instrumentation`` (``close()`` it when done; closing the loop does
    not)."""
    log, session, model, provider = _source(loop, model, provider)
    builder = SpanBuilder(session, tracer_provider, agent_name=agent_name, model=model, provider=provider, latest=latest)
    return Instrumentation(log, builder, interval)
