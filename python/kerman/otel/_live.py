"""The live exporters (``kerman.otel.instrument``): a thread of their own reads what the log
committed, in batches. ``Instrumentation`` builds SDK spans in Python (``tracer_provider=``);
``NativeInstrumentation`` has the core fold and encode them as OTLP and posts the body."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

from .._core import OtlpSpans

if TYPE_CHECKING:
    from ._spans import SpanBuilder

__all__ = ["Instrumentation", "NativeInstrumentation"]

_logger = logging.getLogger("kerman")


class Instrumentation:
    """A live exporter (``instrument(loop)``): a thread of its own reads what the log committed,
    in batches, and builds and exports the spans; the loop does nothing for it (no callback per
    event, no queue), so an exporter that raises or blocks never reaches the loop. The thread
    wakes every ``interval`` seconds, or at once for ``flush()``; ``close()`` stops it (after
    what the log held); ``errors`` counts the exceptions the builder or exporter raised (the
    first is logged)."""

    def __init__(self, log: Any, builder: Optional[SpanBuilder], interval: float = 0.5) -> None:
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
        assert self.builder is not None  # the native subclass has no builder and its own _build
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


class NativeInstrumentation(Instrumentation):
    """The native live exporter (``instrument(loop, otlp=True)``, docs/tracing.md): each batch
    is one call into the core, ``spans.batch(log)``, which reads the events the log committed
    since the last batch, folds them into spans and encodes those that ended as an OTLP
    protobuf body, in Rust with the interpreter lock released; ``send(body)`` posts it (an
    ``OtlpSender``). A send that fails is counted in ``errors`` (the first is logged) and its
    spans are dropped, never retried into the loop."""

    def __init__(self, log: Any, spans: OtlpSpans, send: Callable[[bytes], Any], interval: float = 0.5) -> None:
        self.spans = spans
        self.send = send
        super().__init__(log, None, interval)

    def _build(self) -> None:
        try:
            body = self.spans.batch(self.log)
        except Exception:  # a log closed under us: nothing more to read, the thread stops
            self._failed()
            body = None
            with self._changed:
                self._stopping = True
        if body is not None:
            try:
                self.send(body)
            except Exception:
                self._failed()
        position = self.spans.position
        self.exported = position - 1
        with self._changed:
            self._built = position
            self._changed.notify_all()

    def close(self, timeout: Optional[float] = None) -> None:
        """Sends what the log holds, then stops the thread (waiting at most ``timeout``
        seconds; a send still retrying then gives up)."""
        super().close(timeout)
        stop = getattr(self.send, "stop", None)
        if stop is not None and self._thread.is_alive():
            stop()
            self._thread.join(timeout)
        done = getattr(self.send, "close", None)
        if done is not None and not self._thread.is_alive():
            done()  # the kept-alive connection
