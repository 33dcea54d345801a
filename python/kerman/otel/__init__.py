"""OpenTelemetry traces derived from the log (docs/tracing.md): ``export(log)`` after the fact,
``instrument(loop)`` live. Needs the ``kerman[otel]`` extra (``opentelemetry-api`` and
``-sdk``); ``import kerman`` does not import this module."""

from __future__ import annotations

import logging
import queue
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


_STOP = object()


class Instrumentation:
    """A live exporter (``instrument(loop)``): a log subscriber that only queues each committed
    event; a thread of its own builds and exports the spans, so an exporter that raises or
    blocks never reaches the loop. ``close()`` stops it (after what was queued);
    ``errors`` counts the exceptions the exporter raised (the first is logged)."""

    def __init__(self, log: Any, builder: SpanBuilder) -> None:
        self.log = log
        self.builder = builder
        self.errors = 0
        self.exported = -1  # the last seq built
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._pending = 0
        # Subscribe first, then read what the log held by then: the worker builds that backlog
        # first, then the queued events from its end on (an event committed between the two
        # steps is in both; the seq check drops the second copy).
        self._unsubscribe = log.subscribe(self._put)
        self._backlog = list(log.events())
        with self._idle:
            self._pending += len(self._backlog)
        self._thread = threading.Thread(target=self._run, name=f"kerman.otel {log.id}", daemon=True)
        self._thread.start()

    def _put(self, event: Any) -> None:
        with self._idle:
            self._pending += 1
        self._queue.put(event)

    def _events(self) -> Any:
        backlog, self._backlog = self._backlog, []
        yield from backlog
        while True:
            event = self._queue.get()
            if event is _STOP:
                return
            yield event

    def _run(self) -> None:
        for event in self._events():
            try:
                if event.seq > self.exported:
                    self.exported = event.seq
                    self.builder.add(ev.view(event))
            except Exception:
                self.errors += 1
                if self.errors == 1:
                    _logger.warning("kerman.otel: building or exporting the spans of %r failed", self.log.id, exc_info=True)
            finally:
                with self._idle:
                    self._pending -= 1
                    if not self._pending:
                        self._idle.notify_all()

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Waits until every event queued so far is built (``False``: ``timeout`` passed first)."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    def close(self, timeout: Optional[float] = None) -> None:
        """Unsubscribes, then stops the thread once it has built what was queued (waiting at
        most ``timeout`` seconds for a blocked exporter)."""
        self._unsubscribe()
        self._queue.put(_STOP)
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
) -> Instrumentation:
    """Exports ``loop``'s spans live (and those of the events its log holds already): each span
    is built when the log shows it ended, on a thread of its own. Returns the
    ``Instrumentation`` (``close()`` it when done; closing the loop does not)."""
    log, session, model, provider = _source(loop, model, provider)
    builder = SpanBuilder(session, tracer_provider, agent_name=agent_name, model=model, provider=provider, latest=latest)
    return Instrumentation(log, builder)
